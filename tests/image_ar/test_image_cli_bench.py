"""`mmspec generate-image` and `mmspec bench image` on a tiny random model folder."""

import json
import re
import sys
import types

import pytest
from PIL import Image

from mmspec.cli import main
from mmspec.image_ar import SpeculativeImagePipeline, bench_image
from mmspec.image_ar.bench import default_methods

from .pipeline_checks import generate_image_default_out, generate_image_fails, generate_image_json
from .tiny_image_folder import build_tiny_folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_tiny_folder(tmp_path_factory.mktemp("tiny-image-ar"))


def test_generate_image_json(folder, tmp_path, capsys):
    data = generate_image_json(folder, "Red Circle", "gsd", 3, tmp_path / "x.png", capsys, size=(16, 16))
    assert data["class"] == "red circle" and data["class_id"] == 0
    assert {"acceptance_rate", "tokens_per_s"} <= set(data["stats"])


def test_generate_image_by_id_default_out_and_text_output(folder, tmp_path, capsys, monkeypatch):
    generate_image_default_out(folder, "2", "green_triangle.png", tmp_path, capsys, monkeypatch)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["purple hexagon"], "unknown class 'purple hexagon'"),
        (["7"], r"in \[0, 3\)"),
        (["red circle", "--out", "x.txt"], "image suffix"),
        (["red circle", "--out", "/no/such/dir/x.png"], "existing folder"),
    ],
)
def test_generate_image_errors(folder, capsys, argv, message):
    generate_image_fails(folder, capsys, argv, message)


def test_default_zoo_model_without_weights_says_how_to_rebuild(tmp_path, capsys, monkeypatch):
    import mmspec.zoo

    entry = tmp_path / "shapes-image-ar"
    entry.mkdir()
    (entry / "zoo_card.json").write_text(json.dumps({"rebuild_command": "python -m mmspec.image_ar.recipes.train_image_ar"}))
    monkeypatch.setattr(mmspec.zoo, "MODELS_DIR", tmp_path)
    code = main(["generate-image", "red circle"])
    err = capsys.readouterr().err
    assert code == 2 and "using the embedded toy image model 'shapes-image-ar'" in err
    assert "has no weights" in err and "train_image_ar" in err


def test_bench_image_cli_json_and_grid(folder, tmp_path, capsys):
    grid = tmp_path / "grid.png"
    code = main(["bench", "image", "--model", str(folder), "--n", "2", "--seed", "1", "--threads", "1", "--lantern", "0.1,4",
                 "--grid-out", str(grid), "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    data = json.loads(captured.out)
    rows = {r["method"]: r for r in data["methods"]}
    assert list(rows) == ["ar", "sd k=4", "sjd W=16", "gsd W=16", "lantern d=0.1 k=4 drafter", "lantern d=0.1 k=4 jacobi"]
    assert rows["ar"]["speed_up"] == pytest.approx(1.0) and rows["ar"]["step_compression"] == 1.0
    for row in rows.values():
        assert row["new_tokens"] == 32 and row["target_forwards"] <= 32 and row["wall_time_median_s"] > 0
        assert "identical_to_reference" not in row  # sampled outputs are not compared token for token
    assert rows["sd k=4"]["drafter_forwards"] > 0 and rows["sjd W=16"]["drafter_forwards"] == 0
    assert any("judge" in note for note in data["notes"])
    assert Image.open(grid).size[1] == 6 * 66


def test_bench_image_table_and_bad_settings(folder, capsys):
    assert main(["bench", "image", "--model", str(folder), "--n", "1", "--lantern", "0.2,3", "--temperature", "0"]) == 0
    table = capsys.readouterr().out
    assert "steps x" in table and "speed-up" in table and "lantern d=0.2 k=3 jacobi" in table
    assert main(["bench", "image", "--model", str(folder), "--lantern", "0.1"]) == 2
    assert "DELTA,K" in capsys.readouterr().err
    assert main(["bench", "image", "--model", str(folder), "--n", "1", "--lantern", "0.2,3", "--gsd", "5,none,1.5",
                 "--temperature", "0"]) == 0
    assert "gsd W=16 g=5 p=None d=1.5" in capsys.readouterr().out
    for bad in ("5,0.1", "x,0.1,0.5", "none,0.1,0.5"):
        assert main(["bench", "image", "--model", str(folder), "--gsd", bad]) == 2
        assert "GROUP,PROB,DIST" in capsys.readouterr().err


def test_bench_quality_from_a_judge(folder, tmp_path, monkeypatch):
    """With judge/ next to the model and a judge module, rows get class accuracy and FD vs an independent AR run."""
    seen = {}

    def class_accuracy(images, labels):
        seen["labels"] = labels
        return 0.5

    def frechet_distance(images, reference):
        assert len(images) == len(reference) == 3
        return 1.25

    monkeypatch.setitem(sys.modules, "mmspec.image_ar.judge",
                        types.SimpleNamespace(class_accuracy=class_accuracy, frechet_distance=frechet_distance))
    pipe = SpeculativeImagePipeline.from_pretrained(folder)
    judge_dir = tmp_path / "judge"
    judge_dir.mkdir()
    methods = {k: v for k, v in default_methods(True, lantern_settings=[(0.1, 4)]).items() if k in ("ar", "sjd W=16")}
    report = bench_image(pipe, [0, 1, 2], methods=methods, judge_dir=judge_dir, progress=False, warmup=0)
    assert seen["labels"] == [0, 1, 2] and not report.notes
    for row in report.rows:
        assert row["class_accuracy"] == 0.5 and row["fd_vs_ar"] == 1.25
    assert "class acc" in report.to_table()


def last_error_line(err):
    return err.strip().splitlines()[-1]  # after transformers' weight-loading bars


@pytest.mark.slow
def test_generate_image_lantern_options_from_the_card_and_the_command_line(folder, tmp_path, capsys):
    """LANTERN's k and delta: the model card's lantern_defaults, else the authors' (k = 1000, checked against the
    codebook: one clear error on this 12-code toy), overridden by --lantern-k / --lantern-delta."""
    out = str(tmp_path / "x.png")
    base = ["generate-image", "red circle", "--method", "lantern", "--out", out, "--json"]
    assert main([*base, "--model", str(folder)]) == 2  # no card: the authors' 1000 neighbours
    err = capsys.readouterr().err
    assert "Traceback" not in err and last_error_line(err) == (
        "mmspec: error: LANTERN's neighbourhood lantern_k=1000 does not fit this 12-code codebook: it must be in [1, 11] "
        "(the default 1000 is the authors' for a 16384-code codebook). Set lantern_k (CLI: --lantern-k), or give the "
        "model card lantern_defaults")
    assert main([*base, "--model", str(folder), "--lantern-k", "4", "--lantern-delta", "0.2"]) == 0
    settings = json.loads(capsys.readouterr().out)["settings"]
    assert settings["lantern_k"] == 4 and settings["lantern_delta"] == 0.2 and settings["drafts"] == "drafter"
    for flags, message in [(["--lantern-k", "12"], "lantern_k=12 does not fit this 12-code codebook"),
                           (["--lantern-k", "4", "--lantern-delta", "1.5"], r"--lantern-delta: expected a number in \[0, 1\], got '1.5'"),
                           (["--lantern-k", "4", "--lantern-lam", "0.5"], "lantern_lam")]:
        assert main([*base, "--model", str(folder), *flags]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and re.search(message, last_error_line(err)), flags

    carded = build_tiny_folder(tmp_path / "carded", card={"lantern_defaults": {"lantern_k": 5, "lantern_delta": 0.3}})
    assert main([*base, "--model", str(carded)]) == 0
    settings = json.loads(capsys.readouterr().out)["settings"]
    assert (settings["lantern_k"], settings["lantern_delta"]) == (5, 0.3)  # the card's
    assert main([*base, "--model", str(carded), "--lantern-delta", "0.05"]) == 0
    settings = json.loads(capsys.readouterr().out)["settings"]
    assert (settings["lantern_k"], settings["lantern_delta"]) == (5, 0.05)  # the flag wins, the card fills the rest
    assert main([*base, "--model", str(carded), "--lantern-k", "40"]) == 2
    assert "lantern_k=40 does not fit" in last_error_line(capsys.readouterr().err)


def test_generate_image_gsd_options(folder, tmp_path, capsys):
    out = str(tmp_path / "x.png")
    base = ["generate-image", "red circle", "--model", str(folder), "--method", "gsd", "--out", out, "--json"]
    assert main(base) == 0
    settings = json.loads(capsys.readouterr().out)["settings"]
    assert settings == {"window": 16, "init": "left", "gsd_window": 7, "gsd_prob_threshold": 0.15,
                        "gsd_distance_threshold": 0.5, "gsd_latents": "embeddings"}  # the authors'
    assert main([*base, "--gsd-window", "3", "--gsd-prob-threshold", "none", "--gsd-latents", "codebook"]) == 0
    settings = json.loads(capsys.readouterr().out)["settings"]
    assert (settings["gsd_window"], settings["gsd_prob_threshold"], settings["gsd_latents"]) == (3, None, "codebook")
    assert main([*base, "--gsd-latents", "pixels"]) == 2  # argparse's choices: one line, status 2
    capsys.readouterr()


def test_bench_image_lantern_rows_report_the_output_law(tmp_path, capsys):
    """Default LANTERN rows come from the card; each reports the TV between p and its exact output law."""
    carded = build_tiny_folder(tmp_path / "carded", card={"lantern_defaults": {"lantern_k": 3, "lantern_delta": 0.2}})
    code = main(["bench", "image", "--model", str(carded), "--n", "2", "--threads", "1", "--methods", "lantern", "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    rows = {r["method"]: r for r in json.loads(captured.out)["methods"]}
    assert list(rows) == ["ar", "lantern d=0.2 k=3 drafter", "lantern d=0.2 k=3 jacobi"]
    assert "output_tv_mean" not in rows["ar"]
    for name in ("lantern d=0.2 k=3 drafter", "lantern d=0.2 k=3 jacobi"):
        row = rows[name]
        assert row["lantern_delta"] == 0.2 and row["lantern_k"] == 3 and row["output_tv_steps"] > 0
        assert 0 <= row["output_tv_mean"] <= row["output_tv_max"] <= 1 and "exact" in row["output_tv_method"]
    assert main(["bench", "image", "--model", str(carded), "--n", "1", "--threads", "1", "--methods", "lantern"]) == 0
    table = capsys.readouterr().out
    assert "TV out" in table and "not this" in table


def test_bench_image_checks_settings_before_running(folder, capsys):
    assert main(["bench", "image", "--model", str(folder), "--n", "1", "--lantern", "0.1,12"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "lantern_k=12 does not fit this 12-code codebook" in last_error_line(err)
    assert main(["bench", "image", "--model", str(folder), "--n", "1", "--methods", "gsd", "--gsd", "7,0.3,1.0,codebook",
                 "5,none,none", "--temperature", "0"]) == 0
    table = capsys.readouterr().out
    assert "gsd W=16 g=7 p=0.3 d=1.0 codebook" in table and "gsd W=16 g=5 p=None d=None" in table
    assert "sjd W=16" not in table and "lantern" not in table  # --methods: ar and the GSD rows only
    assert main(["bench", "image", "--model", str(folder), "--gsd", "7,0.3,1.0,pixels"]) == 2
    assert "LATENTS" in capsys.readouterr().err
