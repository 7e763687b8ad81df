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

from .tiny_image_folder import build_tiny_folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_tiny_folder(tmp_path_factory.mktemp("tiny-image-ar"))


def test_generate_image_json(folder, tmp_path, capsys):
    out = tmp_path / "x.png"
    code = main(["generate-image", "Red Circle", "--model", str(folder), "--method", "gsd", "--seed", "3",
                 "--guidance-scale", "2", "--out", str(out), "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    data = json.loads(captured.out)
    assert data["method"] == "gsd" and data["class"] == "red circle" and data["class_id"] == 0 and data["out"] == str(out)
    stats = data["stats"]
    assert {"new_tokens", "target_forwards", "step_compression", "mean_accepted_length", "acceptance_rate", "wall_time_s",
            "tokens_per_s"} <= set(stats)
    assert stats["new_tokens"] == 16 and stats["step_compression"] == pytest.approx(16 / stats["target_forwards"])
    assert Image.open(out).size == (16, 16)


def test_generate_image_by_id_default_out_and_text_output(folder, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["generate-image", "2", "--model", str(folder), "--temperature", "0"]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == "green_triangle.png" and (tmp_path / "green_triangle.png").is_file()
    assert "method 'sjd'" in captured.err and "step compression" in captured.err


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
    code = main(["generate-image", *argv, "--model", str(folder)])
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]  # after transformers' weight-loading bars, if the model was loaded
    assert code == 2 and last.startswith("mmspec: error:") and "Traceback" not in err
    assert re.search(message, last)


def test_default_zoo_model_without_weights_says_how_to_rebuild(tmp_path, capsys, monkeypatch):
    import mmspec.zoo

    entry = tmp_path / "shapes-image-ar"
    entry.mkdir()
    (entry / "zoo_card.json").write_text(json.dumps({"rebuild_command": "python -m mmspec.zoo.training.train_image_ar"}))
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
