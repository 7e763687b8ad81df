"""Big targets through accelerate: a target loaded with `from_pretrained(device_map=..., offload_folder=...)`,
some layers on the CPU and some offloaded to the disk, decodes speculatively exactly as its own `generate`.

Tiny random models are saved and loaded back dispatched (the path a real checkpoint takes); the maps
place whole layers on "disk", so accelerate loads their weights from the offload folder at every forward.
"""

from __future__ import annotations

import pytest
import torch

from mmspec import MMSpecError, speculative_generate
from mmspec.devices import as_device, input_device, load_options, place_drafter
from mmspec.testing import NeverAgreeDrafter, assert_greedy_equal, tiny_llama
from mmspec.trees import TreeConfig

from .speech.tiny_whisper import features, tiny_whisper
from .vision.drafters import MultimodalNeverAgreeDrafter
from .vision.tiny_vlms import llava, text_drafter_lm

MAX_NEW = 16
# Llama: embeddings and the first layers on the CPU, the last two layers offloaded to the disk.
LLAMA_MAP = {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "cpu", "model.layers.2": "disk",
             "model.layers.3": "disk", "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "cpu"}
# The same with the embeddings offloaded too: the model's first parameter is then on the meta device.
LLAMA_MAP_EMBEDDINGS_ON_DISK = {**LLAMA_MAP, "model.embed_tokens": "disk"}


def dispatched(model, device_map, folder, **options):
    """`model` saved to `folder` and loaded back spread by accelerate (`device_map`, offload to `folder/offload`)."""
    model.save_pretrained(folder / "model")
    loaded = type(model).from_pretrained(folder / "model", device_map=device_map, offload_folder=folder / "offload", **options)
    return loaded.eval()


def tiny_target(seed: int = 0, perturb_disk_layer: bool = False):
    """A 4-layer random Llama; with `perturb_disk_layer`, the same weights but layer 3 (offloaded to disk) changed."""
    model = tiny_llama(num_layers=4, hidden_size=32, seed=seed, initializer_range=0.3, eos_token_id=None)
    if perturb_disk_layer:
        with torch.no_grad():
            model.model.layers[3].mlp.down_proj.weight.mul_(-1)
    return model


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return dispatched(tiny_target(), LLAMA_MAP, tmp_path_factory.mktemp("llama"))


@pytest.fixture(scope="module")
def drafter():
    return tiny_llama(num_layers=1, hidden_size=32, seed=5, initializer_range=0.3, eos_token_id=None)


PROMPT = torch.tensor([[1, 17, 23, 5, 60, 41, 9, 12]])


def test_the_map_spreads_the_target_over_cpu_and_disk(llama):
    assert set(llama.hf_device_map.values()) == {"cpu", "disk"}
    assert llama.model.layers[3].mlp.down_proj.weight.device.type == "meta"  # its weights live in the offload folder
    assert input_device(llama) == torch.device("cpu")


@pytest.mark.parametrize("kind", ["model", "self", "never"])
@pytest.mark.parametrize("k", [1, 4])
def test_greedy_on_a_dispatched_target_equals_its_generate(llama, drafter, tmp_path, kind, k):
    chosen = {"model": drafter, "self": tiny_target(), "never": NeverAgreeDrafter(tiny_target())}[kind]
    out = assert_greedy_equal(llama, chosen, PROMPT, max_new_tokens=MAX_NEW, num_draft_tokens=k)
    assert out.stats.new_tokens == MAX_NEW
    if kind == "self":
        assert out.stats.accepted > 0 and out.stats.target_forwards < MAX_NEW
    if kind == "never":
        assert out.stats.accepted == 0


@pytest.mark.parametrize("kind", ["model", "never"])
def test_a_ragged_batch_on_a_dispatched_target_equals_its_generate(llama, drafter, kind):
    """Batch > 1 (left-padded, rows accepting different numbers of drafts) through the offloaded layers."""
    prompts = [[1, 17, 23, 5, 60, 41, 9, 12], [1, 5, 6], [1, 40, 41, 40, 41, 40]]
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    chosen = drafter if kind == "model" else NeverAgreeDrafter(tiny_target())
    expected = llama.generate(ids, attention_mask=mask, max_new_tokens=MAX_NEW, do_sample=False)
    out = speculative_generate(llama, chosen, ids, attention_mask=mask, max_new_tokens=MAX_NEW, num_draft_tokens=3)
    assert torch.equal(out.sequences, expected)


def test_control_the_offloaded_layers_take_part(llama, drafter, tmp_path):
    """Failing control: a target differing only in a layer on the disk decodes differently, so the
    equality above compares outputs that the offloaded weights decide."""
    changed = dispatched(tiny_target(perturb_disk_layer=True), LLAMA_MAP, tmp_path)
    ours = speculative_generate(llama, drafter, PROMPT, max_new_tokens=MAX_NEW).sequences
    theirs = speculative_generate(changed, drafter, PROMPT, max_new_tokens=MAX_NEW).sequences
    assert not torch.equal(ours, theirs)
    with pytest.raises(AssertionError, match="differs from target.generate"):
        assert_greedy_equal(changed, drafter, PROMPT, max_new_tokens=MAX_NEW,
                            reference=llama.generate(PROMPT, do_sample=False, max_new_tokens=MAX_NEW))


def test_dispatched_output_equals_the_whole_models(llama, drafter):
    whole = tiny_target()
    expected = whole.generate(PROMPT, do_sample=False, max_new_tokens=MAX_NEW)
    assert torch.equal(speculative_generate(llama, drafter, PROMPT, max_new_tokens=MAX_NEW).sequences, expected)


def test_sampling_on_a_dispatched_target_repeats_with_its_seed(llama, drafter):
    def sample(seed):
        return speculative_generate(llama, drafter, PROMPT, max_new_tokens=MAX_NEW, do_sample=True, temperature=1.5,
                                    generator=torch.Generator().manual_seed(seed)).sequences

    first = sample(3)
    assert torch.equal(first, sample(3))
    assert not torch.equal(first, sample(4))  # control: the seed decides the draws


def test_sampling_on_a_dispatched_target_equals_the_whole_models(llama, drafter):
    """Same weights, same draws: a seed samples the same tokens whether the target is spread or whole."""
    def sample(target):
        return speculative_generate(target, drafter, PROMPT, max_new_tokens=MAX_NEW, do_sample=True, top_k=20,
                                    generator=torch.Generator().manual_seed(11)).sequences

    assert torch.equal(sample(llama), sample(tiny_target()))


def test_max_memory_auto_map_offloads_and_stays_lossless(drafter, tmp_path):
    """device_map="auto" bounded by max_memory: accelerate keeps what fits on the CPU and offloads the rest."""
    model = dispatched(tiny_target(), "auto", tmp_path, max_memory={"cpu": "100KB"})
    assert {"cpu", "disk"} <= set(model.hf_device_map.values())
    assert_greedy_equal(model, drafter, PROMPT, max_new_tokens=MAX_NEW, num_draft_tokens=3)


def test_embeddings_on_disk_greedy(drafter, tmp_path):
    """The first parameter offloaded: `model.device` reads "meta", the inputs still go to the CPU."""
    model = dispatched(tiny_target(), LLAMA_MAP_EMBEDDINGS_ON_DISK, tmp_path)
    assert model.device.type == "meta" and input_device(model) == torch.device("cpu")
    assert_greedy_equal(model, drafter, PROMPT, max_new_tokens=MAX_NEW, num_draft_tokens=3)


def test_embeddings_on_disk_sampling_without_a_generator(drafter, tmp_path):
    """No generator: the private one is seeded from torch's global seed on the input device, not on "meta"."""
    model = dispatched(tiny_target(), LLAMA_MAP_EMBEDDINGS_ON_DISK, tmp_path)

    def sample(target, seed):
        torch.manual_seed(seed)
        return speculative_generate(target, drafter, PROMPT, max_new_tokens=MAX_NEW, do_sample=True,
                                    temperature=1.5).sequences

    first = sample(model, 0)
    assert torch.equal(first, sample(model, 0)) and torch.equal(first, sample(tiny_target(), 0))
    assert not torch.equal(first, sample(model, 1))  # control: the global seed decides the draws


@pytest.fixture(scope="module")
def llama_embeddings_on_disk(tmp_path_factory):
    return dispatched(tiny_target(), LLAMA_MAP_EMBEDDINGS_ON_DISK, tmp_path_factory.mktemp("llama-embeddings-on-disk"))


@pytest.mark.parametrize("settings", [{"suppress_tokens": [9, 94]}, {"begin_suppress_tokens": [9]},
                                      {"min_new_tokens": 10, "eos_token_id": 94}, {"repetition_penalty": 1.3}])
def test_embeddings_on_disk_with_logits_processors(llama_embeddings_on_disk, settings):
    """generate's processors are built on the input device (on "meta", suppression fails and the minimum
    length's end-token tensor reads nothing, so an end token came early)."""
    out = assert_greedy_equal(llama_embeddings_on_disk, tiny_target(), PROMPT, max_new_tokens=MAX_NEW, **settings)
    assert out.stats.new_tokens >= settings.get("min_new_tokens", MAX_NEW)
    plain = llama_embeddings_on_disk.generate(PROMPT, do_sample=False, max_new_tokens=MAX_NEW,
                                              eos_token_id=settings.get("eos_token_id"))
    assert not torch.equal(out.sequences, plain)  # control: each setting changes this output


def test_embeddings_on_disk_ragged_batch_with_rows_ending_early(llama_embeddings_on_disk):
    """Rows that reach the end token leave the batch: the caches keep the other rows, picked on the input device."""
    prompts = [[1, 17, 23, 5, 60, 41, 9, 12], [1, 5, 6], [1, 40, 41, 40, 41, 40]]
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    settings = {"attention_mask": mask, "max_new_tokens": MAX_NEW, "eos_token_id": 94}
    expected = llama_embeddings_on_disk.generate(ids, do_sample=False, **settings)
    assert (expected[:, width:] == 94).any(dim=1).tolist() == [True, False, False]  # row 0 ends, the others run on
    for chosen in (tiny_target(), NeverAgreeDrafter(tiny_target())):
        out = speculative_generate(llama_embeddings_on_disk, chosen, ids, num_draft_tokens=3, **settings)
        assert torch.equal(out.sequences, expected)


def test_embeddings_on_disk_tree_decoding(drafter, tmp_path):
    """Tree rounds keep the accepted path's cache entries with positions built on the input device."""
    model = dispatched(tiny_target(), LLAMA_MAP_EMBEDDINGS_ON_DISK, tmp_path)
    out = assert_greedy_equal(model, tiny_target(), PROMPT, max_new_tokens=MAX_NEW, tree=TreeConfig(num_nodes=8, depth=4))
    assert out.stats.accepted > 0


@pytest.mark.parametrize("tree", [None, TreeConfig(num_nodes=8, depth=4)])
def test_a_drafter_with_its_embeddings_on_disk(llama, tmp_path, tree):
    """The drafter's own first parameter offloaded (its `device` reads "meta"): it drafts on its input device."""
    self_drafter = dispatched(tiny_target(), LLAMA_MAP_EMBEDDINGS_ON_DISK, tmp_path)
    assert self_drafter.device.type == "meta"
    out = assert_greedy_equal(llama, self_drafter, PROMPT, max_new_tokens=MAX_NEW, num_draft_tokens=4, tree=tree)
    assert out.stats.accepted > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an accelerator for the drafter")
def test_a_model_drafter_on_another_device_than_the_target(llama):
    """A ModelDrafter on the accelerator, no accelerate hook: tokens go there, its logits come back to the CPU."""
    from mmspec import ModelDrafter

    on_gpu = tiny_target().to("cuda")
    out = assert_greedy_equal(llama, ModelDrafter(on_gpu), PROMPT, max_new_tokens=MAX_NEW, num_draft_tokens=4)
    assert out.sequences.device.type == "cpu" and out.stats.accepted > 0


# --- encoder-decoder: Whisper --------------------------------------------------------------------------

WHISPER_MAP = {"model.encoder": "cpu", "model.decoder.embed_tokens": "cpu", "model.decoder.embed_positions": "cpu",
               "model.decoder.layers.0": "cpu", "model.decoder.layers.1": "disk", "model.decoder.layer_norm": "disk",
               "proj_out": "cpu"}


@pytest.fixture(scope="module")
def whisper(tmp_path_factory):
    return dispatched(tiny_whisper(), WHISPER_MAP, tmp_path_factory.mktemp("whisper"))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["model", "never"])
def test_whisper_with_decoder_layers_on_disk_equals_its_generate(whisper, kind):
    assert set(whisper.hf_device_map.values()) == {"cpu", "disk"}
    drafter = tiny_whisper(seed=1, decoder_layers=1) if kind == "model" else NeverAgreeDrafter(tiny_whisper())
    for seed in (0, 1):
        x = features(seed)
        expected = whisper.generate(x, do_sample=False, max_new_tokens=MAX_NEW, return_dict_in_generate=True).sequences
        out = speculative_generate(whisper, drafter, None, max_new_tokens=MAX_NEW, num_draft_tokens=4, input_features=x)
        assert torch.equal(out.sequences, expected)
        if kind == "never":
            assert out.stats.accepted == 0


@pytest.mark.parametrize("kind", ["model", "never"])
def test_whisper_with_the_encoder_on_disk(tmp_path, kind):
    """The encoder (the first parameters) offloaded: whisper.device reads "meta"; the decoder prompt is built on
    the input device. Compared with the whole model's generate."""
    model = dispatched(tiny_whisper(), {"model.encoder": "disk", "model.decoder": "cpu", "proj_out": "cpu"}, tmp_path)
    assert model.device.type == "meta"
    drafter = tiny_whisper(seed=1, decoder_layers=1) if kind == "model" else NeverAgreeDrafter(tiny_whisper())
    for seed in (0, 1):
        x = features(seed)
        expected = tiny_whisper().generate(x, do_sample=False, max_new_tokens=MAX_NEW, return_dict_in_generate=True).sequences
        out = speculative_generate(model, drafter, None, max_new_tokens=MAX_NEW, num_draft_tokens=4, input_features=x)
        assert torch.equal(out.sequences, expected)


# --- a vision-language model: LLaVA ---------------------------------------------------------------------

LLAVA_MAP = {"model.vision_tower": "cpu", "model.multi_modal_projector": "disk", "model.language_model.embed_tokens": "cpu",
             "model.language_model.layers.0": "cpu", "model.language_model.layers.1": "disk",
             "model.language_model.norm": "cpu", "model.language_model.rotary_emb": "cpu", "lm_head": "cpu"}


@pytest.mark.parametrize("kind", ["text-only", "never"])
def test_llava_with_layers_on_disk_equals_its_generate(tmp_path, kind):
    from mmspec.vision import TextOnlyDrafter

    case = llava()
    model = dispatched(case.model, LLAVA_MAP, tmp_path)
    assert set(model.hf_device_map.values()) == {"cpu", "disk"}
    drafter = TextOnlyDrafter(text_drafter_lm(), model) if kind == "text-only" else MultimodalNeverAgreeDrafter(case.model)
    expected = model.generate(case.input_ids, do_sample=False, max_new_tokens=MAX_NEW, **case.inputs)
    out = speculative_generate(model, drafter, case.input_ids, max_new_tokens=MAX_NEW, num_draft_tokens=3, **case.inputs)
    assert torch.equal(out.sequences, expected)
    assert torch.equal(expected, case.model.generate(case.input_ids, do_sample=False, max_new_tokens=MAX_NEW, **case.inputs))


@pytest.mark.parametrize("kind", ["text-only", "text-only-on-disk", "never"])
def test_llava_with_the_vision_tower_on_disk(tmp_path, kind):
    """The vision tower (the first parameters) offloaded: model.device reads "meta"; placeholder ids live on the
    input device. A text-only drafter may have its own embeddings on the disk too."""
    from mmspec.vision import TextOnlyDrafter

    case = llava()
    model = dispatched(case.model, {**LLAVA_MAP, "model.vision_tower": "disk"}, tmp_path)
    assert model.device.type == "meta"
    if kind == "never":
        drafter = MultimodalNeverAgreeDrafter(case.model)
    else:
        lm = text_drafter_lm()
        if kind == "text-only-on-disk":
            lm = dispatched(lm, {"model.embed_tokens": "disk", "model.layers.0": "cpu", "model.norm": "cpu",
                                 "model.rotary_emb": "cpu", "lm_head": "cpu"}, tmp_path / "drafter")
            assert lm.device.type == "meta"
        drafter = TextOnlyDrafter(lm, model)
    expected = case.model.generate(case.input_ids, do_sample=False, max_new_tokens=MAX_NEW, **case.inputs)
    out = speculative_generate(model, drafter, case.input_ids, max_new_tokens=MAX_NEW, num_draft_tokens=3, **case.inputs)
    assert torch.equal(out.sequences, expected)


# --- loading options and the drafter's device -----------------------------------------------------------

def test_load_options():
    assert load_options() == {} and load_options(device="cpu") == {}
    assert load_options(max_memory={"cpu": "200MB"}) == {"device_map": "auto", "max_memory": {"cpu": "200MB"}}
    assert load_options(device_map={"model": "cpu", "lm_head": "disk", "x": 0}, offload_folder="off") == {
        "device_map": {"model": "cpu", "lm_head": "disk", "x": 0}, "offload_folder": "off"}


def test_an_accelerator_index_may_be_given_as_text():
    # --device / --drafter-device arrive as text: "0" means what 0 means to torch, not an unknown device
    assert as_device("0") == as_device(0) == torch.device(0)
    assert as_device("cpu") == torch.device("cpu") and as_device("cuda:1") == torch.device("cuda", 1)
    with pytest.raises(MMSpecError, match="is not a device"):
        as_device("-1")
    with pytest.raises(MMSpecError, match="is not a device"):
        as_device("gpu")


@pytest.mark.parametrize("options, message", [
    ({"device": "cpu", "device_map": "auto"}, "not both"),
    ({"offload_folder": "off"}, "pass device_map too"),
    ({"device_map": "everywhere"}, "is not a strategy"),
    ({"device_map": {}}, "non-empty"),
    ({"device_map": {"lm_head": "floppy"}}, "device_map['lm_head']: 'floppy' is not a device"),
    ({"device_map": {"lm_head": -1}}, "negative"),
    ({"max_memory": {"cpu": "lots"}}, "max_memory['cpu']: 'lots' is not a size"),
    ({"max_memory": {"cpu": 0}}, "is not a size"),
    ({"max_memory": {"disk": "1GB"}}, "the disk takes what is left"),
    ({"max_memory": "200MB"}, "max_memory must be a non-empty"),
])
def test_bad_load_options_are_one_clear_error(options, message):
    with pytest.raises(MMSpecError, match=None) as raised:
        load_options(**options)
    assert message in str(raised.value)


def test_drafter_follows_the_targets_input_device(llama):
    model = tiny_llama(num_layers=1, hidden_size=32, seed=5)
    assert place_drafter(model, None, llama) is model
    assert model.device == input_device(llama) and not hasattr(model, "_hf_hook")
    with pytest.raises(MMSpecError, match="drafter_device: 'gpu7' is not a device"):
        place_drafter(model, "gpu7", llama)


# --- the pipelines: CaptionPipeline / TranscriptionPipeline.from_pretrained(device_map=...) -------------

from .speech.test_pipeline import asr_folder, clip, greedy  # noqa: E402,F401 - fixtures and helper shared with the speech tests
from .vision.test_pipeline import frames, tiny_captioner_folder  # noqa: E402,F401 - fixtures shared with the vision tests

CAPTIONER_MAP = {"model.vision_tower": "cpu", "model.multi_modal_projector": "cpu",
                 "model.image_newline": "cpu",  # a parameter, not a module: accelerate warns, and places it
                 "model.language_model.embed_tokens": "cpu", "model.language_model.layers.0": "cpu",
                 "model.language_model.layers.1": "disk", "model.language_model.norm": "cpu",
                 "model.language_model.rotary_emb": "cpu", "lm_head": "disk"}


pytestmark = pytest.mark.filterwarnings("ignore:The following device_map keys do not match any submodules")


@pytest.fixture(scope="module")
def dispatched_captioner(tiny_captioner_folder, tmp_path_factory):
    from mmspec.vision.pipeline import CaptionPipeline

    return CaptionPipeline.from_pretrained(tiny_captioner_folder, drafter="shapes-caption-drafter", device_map=CAPTIONER_MAP,
                                           offload_folder=tmp_path_factory.mktemp("offload"))


@pytest.mark.parametrize("method", ["ar", "text", "std"])
def test_caption_pipeline_on_a_dispatched_model_equals_its_generate(dispatched_captioner, frames, method):
    pipe = dispatched_captioner
    assert set(pipe.model.hf_device_map.values()) == {"cpu", "disk"} and pipe.device == torch.device("cpu")
    assert pipe.drafter.device == pipe.device
    inputs = pipe.prepare_inputs(video=frames)
    expected = pipe.model.generate(**inputs, do_sample=False, max_new_tokens=12)
    out = pipe(video=frames, max_new_tokens=12, method=method, progress_bar=False)
    assert out.sequences[0].tolist() == expected[0].tolist()


def test_caption_pipeline_max_memory_means_auto(tiny_captioner_folder, frames, tmp_path):
    from mmspec.vision.pipeline import CaptionPipeline

    pipe = CaptionPipeline.from_pretrained(tiny_captioner_folder, drafter="shapes-caption-drafter",
                                           max_memory={"cpu": "150KB"}, offload_folder=tmp_path)
    assert "disk" in set(pipe.model.hf_device_map.values())
    whole = CaptionPipeline.from_pretrained(tiny_captioner_folder, drafter="shapes-caption-drafter")
    assert pipe(video=frames, max_new_tokens=8, progress_bar=False).text == \
        whole(video=frames, max_new_tokens=8, progress_bar=False).text
    with pytest.raises(MMSpecError, match="spread by accelerate"):
        pipe.to("cpu")


def test_saved_caption_pipeline_loads_dispatched(dispatched_captioner, tiny_captioner_folder, frames, tmp_path):
    from mmspec.vision.pipeline import CaptionPipeline

    whole = CaptionPipeline.from_pretrained(tiny_captioner_folder, drafter="shapes-caption-drafter")
    whole.save_pretrained(tmp_path / "saved")
    pipe = CaptionPipeline.from_pretrained(tmp_path / "saved", device_map=CAPTIONER_MAP, offload_folder=tmp_path / "off",
                                           drafter_device="cpu")
    assert set(pipe.model.hf_device_map.values()) == {"cpu", "disk"}
    assert pipe(video=frames, max_new_tokens=8, method="text", progress_bar=False).text == \
        whole(video=frames, max_new_tokens=8, method="text", progress_bar=False).text


def test_bad_placement_of_a_pipeline_is_one_error(tiny_captioner_folder, asr_folder, tmp_path):
    from mmspec.speech.pipeline import TranscriptionPipeline
    from mmspec.vision.pipeline import CaptionPipeline

    with pytest.raises(MMSpecError, match="not both"):
        CaptionPipeline.from_pretrained(tiny_captioner_folder, device="cpu", device_map="auto")
    with pytest.raises(MMSpecError, match="max_memory\\['cpu'\\]: 'lots' is not a size"):
        CaptionPipeline.from_pretrained(tiny_captioner_folder, max_memory={"cpu": "lots"})
    with pytest.raises(MMSpecError, match="drafter_device: 'gpu7' is not a device"):
        TranscriptionPipeline.from_pretrained(asr_folder, device_map=WHISPER_MAP, offload_folder=tmp_path,
                                              drafter_device="gpu7")


@pytest.mark.parametrize("method", ["ar", "hybrid"])
def test_transcription_pipeline_on_a_dispatched_whisper_equals_its_generate(asr_folder, clip, tmp_path, method):
    from mmspec.speech.audio import load_audio
    from mmspec.speech.pipeline import TranscriptionPipeline

    pipe = TranscriptionPipeline.from_pretrained(asr_folder, device_map=WHISPER_MAP, offload_folder=tmp_path)
    assert set(pipe.model.hf_device_map.values()) == {"cpu", "disk"} and pipe.fast_decoder.device == pipe.device
    expected = greedy(pipe, load_audio(clip), MAX_NEW)
    out = pipe(clip, method=method, max_new_tokens=MAX_NEW, progress_bar=False)
    assert out.chunks[0].tokens == expected


# --- the command line ---------------------------------------------------------------------------------

def test_cli_caption_and_transcribe_with_a_device_map_file(tiny_captioner_folder, asr_folder, clip, tmp_path, capsys):
    import json

    from mmspec.cli import main
    from mmspec.vision import write_video

    from .vision.test_pipeline import cd

    video = write_video(tmp_path / "clip.mp4", np_frames(cd.FRAMES, cd.FRAME_SIZE))
    caption = ["caption", str(video), "--model", str(tiny_captioner_folder), "--drafter", "shapes-caption-drafter",
               "--max-new-tokens", "8", "--json"]
    (tmp_path / "captioner_map.json").write_text(json.dumps(CAPTIONER_MAP))
    (tmp_path / "whisper_map.json").write_text(json.dumps(WHISPER_MAP))
    transcribe = ["transcribe", str(clip), "--model", str(asr_folder), "--max-new-tokens", str(MAX_NEW), "--format", "json"]
    results = []
    for argv in (caption, [*caption, "--device-map", str(tmp_path / "captioner_map.json"), "--offload-folder", str(tmp_path / "a")],
                 transcribe, [*transcribe, "--device-map", str(tmp_path / "whisper_map.json"), "--drafter-device", "cpu"]):
        code = main(argv)
        captured = capsys.readouterr()
        assert code == 0, captured.err
        results.append(json.loads(captured.out))
    assert results[0]["text"] == results[1]["text"] and results[0]["stats"]["new_tokens"] == 8
    assert results[2]["text"] == results[3]["text"] and results[2]["stats"]["new_tokens"] > 0


def np_frames(count: int, size: int):
    import numpy as np

    rng = np.random.default_rng(0)
    return rng.integers(0, 256, (count, size, size, 3), dtype=np.uint8)


def test_an_ar_fast_decoder_sharing_an_offloaded_head_is_refused(tmp_path):
    from mmspec.speech import ARFastDecoder
    from mmspec.speech.pipeline import TranscriptionPipeline

    from .speech.test_pipeline import tiny_processor

    whole = tiny_whisper()
    offloaded = dispatched(whole, {"model.encoder": "cpu", "model.decoder": "disk", "proj_out": "disk"}, tmp_path)
    with pytest.raises(MMSpecError, match="shares the model's token embedding and output head, which the device map offloads"):
        TranscriptionPipeline(offloaded, tiny_processor(), fast_decoder=ARFastDecoder.for_target(whole, share_embeddings=True))
    kept = dispatched(whole, WHISPER_MAP, tmp_path / "kept")  # embedding and head on the CPU: shared as before
    pipe = TranscriptionPipeline(kept, tiny_processor(), fast_decoder=ARFastDecoder.for_target(whole, share_embeddings=True))
    assert pipe.fast_decoder.proj_out is kept.get_output_embeddings()


# The model's first parameter offloaded (`model.device` reads "meta"): LLaVA-NeXT-Video's image_newline and vision
# tower, Whisper's encoder.
CAPTIONER_MAP_FIRST_ON_DISK = {**CAPTIONER_MAP, "model.image_newline": "disk", "model.vision_tower": "disk"}
WHISPER_MAP_ENCODER_ON_DISK = {"model.encoder": "disk", "model.decoder": "cpu", "proj_out": "cpu"}


@pytest.mark.parametrize("method", ["ar", "text", "std"])
def test_caption_pipeline_with_the_first_parameter_on_disk(tiny_captioner_folder, frames, tmp_path, method):
    from mmspec.vision.pipeline import CaptionPipeline

    pipe = CaptionPipeline.from_pretrained(tiny_captioner_folder, drafter="shapes-caption-drafter",
                                           device_map=CAPTIONER_MAP_FIRST_ON_DISK, offload_folder=tmp_path)
    assert pipe.model.device.type == "meta" and pipe.device == torch.device("cpu")
    whole = CaptionPipeline.from_pretrained(tiny_captioner_folder, drafter="shapes-caption-drafter")
    expected = whole.model.generate(**whole.prepare_inputs(video=frames), do_sample=False, max_new_tokens=12)
    out = pipe(video=frames, max_new_tokens=12, method=method, progress_bar=False)
    assert out.sequences[0].tolist() == expected[0].tolist()


@pytest.mark.parametrize("method", ["ar", "hybrid"])
def test_transcription_pipeline_with_the_encoder_on_disk(asr_folder, clip, tmp_path, method):
    from mmspec.speech.audio import load_audio
    from mmspec.speech.pipeline import TranscriptionPipeline

    pipe = TranscriptionPipeline.from_pretrained(asr_folder, device_map=WHISPER_MAP_ENCODER_ON_DISK, offload_folder=tmp_path)
    assert pipe.model.device.type == "meta" and pipe.device == torch.device("cpu")
    expected = greedy(TranscriptionPipeline.from_pretrained(asr_folder), load_audio(clip), MAX_NEW)  # the whole model's
    out = pipe(clip, method=method, max_new_tokens=MAX_NEW, progress_bar=False)
    assert out.chunks[0].tokens == expected


def test_cli_with_the_first_parameter_on_disk(tiny_captioner_folder, asr_folder, clip, tmp_path, capsys):
    import json

    from mmspec.cli import main
    from mmspec.vision import write_video

    from .vision.test_pipeline import cd

    video = write_video(tmp_path / "clip.mp4", np_frames(cd.FRAMES, cd.FRAME_SIZE))
    (tmp_path / "captioner_map.json").write_text(json.dumps(CAPTIONER_MAP_FIRST_ON_DISK))
    (tmp_path / "whisper_map.json").write_text(json.dumps(WHISPER_MAP_ENCODER_ON_DISK))
    caption = ["caption", str(video), "--model", str(tiny_captioner_folder), "--drafter", "shapes-caption-drafter",
               "--max-new-tokens", "8", "--json"]
    transcribe = ["transcribe", str(clip), "--model", str(asr_folder), "--max-new-tokens", str(MAX_NEW), "--format", "json"]
    results = []
    for argv in (caption, [*caption, "--device-map", str(tmp_path / "captioner_map.json"), "--offload-folder", str(tmp_path / "a")],
                 transcribe, [*transcribe, "--device-map", str(tmp_path / "whisper_map.json"), "--offload-folder", str(tmp_path / "b")]):
        code = main(argv)
        captured = capsys.readouterr()
        assert code == 0 and "Traceback" not in captured.err, captured.err
        results.append(json.loads(captured.out))
    assert results[0]["text"] == results[1]["text"] and results[0]["stats"]["new_tokens"] == 8
    assert results[2]["text"] == results[3]["text"] and results[2]["stats"]["new_tokens"] > 0


from .vision.test_feature_methods import drafters, zoo_like_folder  # noqa: E402,F401 - fixtures: msd/ and flash/ drafters


@pytest.mark.slow
@pytest.mark.parametrize("where", ["head", "first", "embeddings"])
@pytest.mark.parametrize("method", ["msd", "flash"])
def test_feature_drafters_on_a_dispatched_captioner(zoo_like_folder, frames, tmp_path, method, where):
    """MSD and FLASH borrow the target's embedding and LM head: with the head on the disk (the drafter then
    sits where accelerate runs the head, not on its weight's meta device), with the first parameter too, and
    with the embedding too (the visual ids live on the input device), output equals the whole model's generate."""
    from mmspec.vision.pipeline import CaptionPipeline

    device_map = {"head": CAPTIONER_MAP, "first": CAPTIONER_MAP_FIRST_ON_DISK,
                  "embeddings": {**CAPTIONER_MAP_FIRST_ON_DISK, "model.language_model.embed_tokens": "disk"}}[where]
    pipe = CaptionPipeline.from_pretrained(zoo_like_folder, device_map=device_map, offload_folder=tmp_path)
    assert pipe.model.hf_device_map["lm_head"] == "disk" and method in pipe.available_methods
    whole = CaptionPipeline.from_pretrained(zoo_like_folder)
    expected = whole.model.generate(**whole.prepare_inputs(video=frames), do_sample=False, max_new_tokens=12)
    out = pipe(video=frames, max_new_tokens=12, method=method, progress_bar=False)
    assert out.sequences[0].tolist() == expected[0].tolist()


@pytest.mark.parametrize("share", [False, True])
def test_an_ar_fast_decoder_built_from_a_whisper_with_its_encoder_on_disk(asr_folder, clip, tmp_path, share):
    """`ARFastDecoder.for_target` on the dispatched model builds on its input device (on meta it held no weights):
    the same network as from the whole model, and hybrid transcription with it equals Whisper's greedy output."""
    from mmspec.speech import ARFastDecoder
    from mmspec.speech.audio import load_audio
    from mmspec.speech.pipeline import TranscriptionPipeline

    from .speech.test_pipeline import tiny_processor

    model = dispatched(tiny_whisper(), WHISPER_MAP_ENCODER_ON_DISK, tmp_path)
    built = ARFastDecoder.for_target(model, share_embeddings=share)
    reference = ARFastDecoder.for_target(tiny_whisper(), share_embeddings=share)
    assert built.device == torch.device("cpu")
    assert all(torch.equal(a, b) for a, b in zip(built.state_dict().values(), reference.state_dict().values()))
    # (audio padding: on this clip the random fast decoder's drafts are then sometimes accepted, with log-mel never)
    pipe = TranscriptionPipeline(model, tiny_processor(), fast_decoder=built, feature_padding="audio")
    expected = greedy(TranscriptionPipeline(tiny_whisper(), tiny_processor(), feature_padding="audio"), load_audio(clip), MAX_NEW)
    out = pipe(clip, method="hybrid", max_new_tokens=MAX_NEW, progress_bar=False)
    assert out.chunks[0].tokens == expected and out.stats.accepted > 0
