"""Self-distillation data, the generic drafter trainer (curriculum, checkpoints, resume) and
`mmspec train-drafter`."""

import json

import pytest
import torch
from transformers import AutoModel

from mmspec import MMSpecError
from mmspec.cli import main
from mmspec.vision.distill_data import DistillDataset, collate, generate_distill_data
from mmspec.vision.drafter_training import CurriculumSampler, drafter_class, multimodal_share, train_drafter
from mmspec.vision.msd import MSDDrafterModel

from .tiny_vlms import BOS, IMAGE, llava

MAX_NEW = 12


def llava_example(seed):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.cat([torch.tensor([BOS]), torch.randint(4, 180, (2,), generator=gen), torch.full((4,), IMAGE),
                     torch.randint(4, 180, (3 + seed,), generator=gen)])[None]
    return {"input_ids": ids, "pixel_values": torch.randn(1, 3, 28, 28, generator=gen)}


@pytest.fixture(scope="module")
def case():
    return llava()


@pytest.fixture(scope="module")
def examples():
    return [llava_example(i) for i in range(3)]


@pytest.fixture(scope="module")
def data_dir(case, examples, tmp_path_factory):
    folder = tmp_path_factory.mktemp("distill") / "data"
    generate_distill_data(case.model, examples, folder, max_new_tokens=MAX_NEW, shard_size=4, progress=False)
    return folder


def eval_loss(model, case, dataset):
    batch = collate([dataset[i] for i in range(len(dataset))])
    with torch.no_grad():
        return float(model.training_loss(batch, case.model.get_input_embeddings(), case.model.get_output_embeddings())["loss"])


def test_traces_follow_the_targets_greedy_decoding(case, examples, data_dir):
    meta = json.loads((data_dir / "metadata.json").read_text())
    assert meta["modalities"] == {"multimodal": 3, "text": 3} and len(meta["shards"]) == 2
    dataset = DistillDataset(data_dir)
    assert len(dataset) == 6 and dataset.indices("text") == [1, 3, 5]
    trace = dataset[0]
    ref = case.model.generate(examples[0]["input_ids"], pixel_values=examples[0]["pixel_values"], do_sample=False,
                              max_new_tokens=MAX_NEW)
    assert torch.equal(trace["input_ids"], ref[0])
    length, prompt = trace["input_ids"].shape[0], trace["prompt_length"]
    assert trace["embeds"].shape == trace["features"].shape == (length, 64) and trace["features"].dtype == torch.float16
    assert trace["visual_mask"].sum() == 4 and trace["modality"] == "multimodal"
    # features are the target's last hidden states: its LM head reads the next greedy token off them.
    with torch.no_grad():
        predicted = case.model.get_output_embeddings()(trace["features"][prompt - 1 : -1].float()).argmax(-1)
        token_embeds = case.model.get_input_embeddings()(trace["input_ids"])
    assert torch.equal(predicted, trace["input_ids"][prompt:])
    text = ~trace["visual_mask"]
    torch.testing.assert_close(trace["embeds"][text].float(), token_embeds[text], atol=1e-2, rtol=1e-2)
    assert not torch.allclose(trace["embeds"][~text].float(), token_embeds[~text], atol=1e-2)
    text_trace = dataset[1]
    assert text_trace["modality"] == "text" and not text_trace["visual_mask"].any()
    assert IMAGE not in text_trace["input_ids"][: text_trace["prompt_length"]].tolist()


def test_collate_pads_right_and_masks_the_continuation(data_dir):
    dataset = DistillDataset(data_dir)
    a, b = dataset[0], dataset[1]
    batch = collate([a, b])
    la, lb = a["input_ids"].shape[0], b["input_ids"].shape[0]
    assert batch.input_ids.shape == (2, max(la, lb)) and batch.features.dtype == torch.float32
    assert batch.attention_mask.sum(1).tolist() == [la, lb]
    for row, trace in enumerate((a, b)):
        n, p = trace["input_ids"].shape[0], trace["prompt_length"]
        assert batch.loss_mask[row].nonzero().flatten().tolist() == list(range(p - 2, n - 1))


def test_generate_refuses_a_non_empty_folder(case, examples, data_dir):
    with pytest.raises(MMSpecError, match="not empty"):
        generate_distill_data(case.model, examples[:1], data_dir, max_new_tokens=2, progress=False)


def test_training_lowers_the_loss_and_round_trips(case, data_dir, tmp_path):
    dataset = DistillDataset(data_dir)
    torch.manual_seed(0)  # train_drafter initialises with the same seed
    before = eval_loss(MSDDrafterModel.from_target_config(case.model.config.get_text_config()), case, dataset)
    model = train_drafter(case.model, "msd", data_dir, tmp_path, steps=40, batch_size=4, lr=3e-3, checkpoint_every=0,
                          progress=False)
    after = eval_loss(model, case, dataset)
    assert after < 0.8 * before
    report = json.loads((tmp_path / "training.json").read_text())
    assert report["steps"] == 40 and report["kind"] == "msd" and report["data"]["num_traces"] == 6
    assert report["final"]["loss"] is not None and len(report["history"]) == 40
    for loaded in (MSDDrafterModel.from_pretrained(tmp_path), AutoModel.from_pretrained(tmp_path)):
        assert type(loaded) is MSDDrafterModel
        for name, value in model.state_dict().items():
            assert torch.equal(loaded.state_dict()[name], value), name
    assert not (tmp_path / "checkpoints").exists()


def test_resume_continues_from_the_saved_step(case, data_dir, tmp_path):
    settings = dict(steps=8, batch_size=2, lr=3e-3, checkpoint_every=4, progress=False)
    straight = train_drafter(case.model, "msd", data_dir, tmp_path / "a", **settings)
    train_drafter(case.model, "msd", data_dir, tmp_path / "b", **settings)
    checkpoints = sorted((tmp_path / "b" / "checkpoints").glob("step-*.pt"))
    assert [p.name for p in checkpoints] == ["step-00000004.pt", "step-00000008.pt"]
    checkpoints[-1].unlink()  # as if interrupted after step 4
    resumed = train_drafter(case.model, "msd", data_dir, tmp_path / "b", resume=True, **settings)
    assert json.loads((tmp_path / "b" / "training.json").read_text())["resumed_from_step"] == 4
    for name, value in straight.state_dict().items():
        assert torch.equal(resumed.state_dict()[name], value), name  # model, optimiser and RNG states all restored


def test_two_stage_curriculum():
    assert multimodal_share(0, 100) == 0.0 and multimodal_share(49, 100) == 0.0
    assert multimodal_share(50, 100) == pytest.approx(0.05) and multimodal_share(99, 100) == pytest.approx(0.95)
    assert multimodal_share(75, 100) == pytest.approx(0.05 + 0.9 * 25 / 49)
    modalities = ["text", "multimodal"] * 5
    sampler = CurriculumSampler(modalities, "two-stage", 100, 0.5, torch.Generator().manual_seed(0))
    assert all(modalities[i] == "text" for i in sampler.sample(10, 64))
    late = [modalities[i] for i in sampler.sample(99, 256)]
    assert late.count("multimodal") > 200
    with pytest.raises(MMSpecError, match="text-only and multimodal"):
        CurriculumSampler(["multimodal"] * 3, "two-stage", 10, 0.5, torch.Generator())


def test_unknown_kind_is_a_clear_error():
    with pytest.raises(MMSpecError, match="unknown drafter kind 'eagle9'"):
        drafter_class("eagle9")


@pytest.fixture(scope="module")
def target_dir(case, tmp_path_factory):
    folder = tmp_path_factory.mktemp("target")
    case.model.save_pretrained(folder)
    return folder


def test_cli_trains_a_drafter(target_dir, data_dir, tmp_path, capsys):
    code = main(["train-drafter", "--target", str(target_dir), "--data", str(data_dir), "--out", str(tmp_path / "d"),
                 "--steps", "2", "--batch-size", "2", "--curriculum", "none", "--threads", "1"])
    assert code == 0
    assert "saved the msd drafter" in capsys.readouterr().out
    assert type(MSDDrafterModel.from_pretrained(tmp_path / "d")) is MSDDrafterModel


@pytest.mark.parametrize("problem, message", [
    ("missing-data", "argument --data: folder not found"),
    ("empty-data", "no metadata.json"),
    ("unknown-kind", "argument --kind: invalid choice: 'medusa'"),
    ("missing-target", "cannot load the target"),
])
def test_cli_bad_input(problem, message, target_dir, data_dir, tmp_path, capsys):
    args = {"--target": str(target_dir), "--data": str(data_dir), "--out": str(tmp_path / "out"), "--kind": "msd"}
    if problem == "missing-data":
        args["--data"] = str(tmp_path / "nowhere")
    elif problem == "empty-data":
        (tmp_path / "empty").mkdir()
        args["--data"] = str(tmp_path / "empty")
    elif problem == "unknown-kind":
        args["--kind"] = "medusa"
    else:
        args["--target"] = str(tmp_path / "no-model")
    code = main(["train-drafter", *[x for pair in args.items() for x in pair], "--steps", "1"])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and err.startswith("mmspec: error:") and "Traceback" not in err
