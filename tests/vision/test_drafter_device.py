"""`drafter_device` (CLI: --drafter-device) places the MSD and FLASH drafters too, not only the text drafter.

A CPU-only machine has one real device, so two checks stand in for a second one: the "meta" device (where
a tensor that should have moved shows up on the CPU instead), and the devices the drafter network's own
layers receive their inputs on. On a machine with a CUDA GPU the whole run is checked against plain decoding.
"""

import pytest
import torch

from mmspec.vision.feature_methods import runtime_drafter
from mmspec.vision.pipeline import CaptionPipeline

from .test_feature_methods import drafters, tiny_drafter, zoo_like_folder  # noqa: F401 (fixtures)
from .test_pipeline import frames, tiny_captioner_folder  # noqa: F401 (fixtures)

WHOLE_ON_CPU = {"": "cpu"}  # a dispatched target in one piece: --drafter-device applies to dispatched targets


class Reached(Exception):
    """Raised by a probe once it has seen where a layer's input is (the run need not go on)."""


def devices_reaching(module: torch.nn.Module, call) -> list[torch.device]:
    """The devices of the tensors `module`'s forward receives during `call()` (stopped at the first forward)."""
    seen: list[torch.device] = []

    def probe(_module, args, kwargs):
        seen.extend(value.device for value in (*args, *kwargs.values()) if isinstance(value, torch.Tensor))
        raise Reached

    handle = module.register_forward_pre_hook(probe, with_kwargs=True)
    try:
        with pytest.raises(Reached):
            call()
    finally:
        handle.remove()
    return seen


@pytest.mark.parametrize("method", ["msd", "flash"])
def test_feature_drafters_sit_on_the_drafter_device(zoo_like_folder, method):
    """Loaded there, and still there once the runtime drafter is bound to the target (which used to move it back
    next to the target's LM head)."""
    pipe = CaptionPipeline.from_pretrained(zoo_like_folder, device_map=WHOLE_ON_CPU, drafter_device="meta")
    network = pipe.feature_drafters[method]
    assert {p.device.type for p in network.parameters()} == {"meta"}
    drafter = pipe.drafter_factories()[method]()
    drafter.bind(pipe.target)
    assert {p.device.type for p in drafter.model.parameters()} == {"meta"}
    assert pipe.model.device.type == "cpu"


@pytest.mark.parametrize("method", ["msd", "flash"])
def test_the_network_computes_on_its_own_device(tiny_captioner_folder, method):
    """The loop hands the network tensors on the target's device (the CPU here); its layers get them on its own."""
    from transformers import AutoConfig

    text_config = AutoConfig.from_pretrained(tiny_captioner_folder).get_text_config()
    network = tiny_drafter(method, text_config).to("meta")
    width = text_config.hidden_size
    embeds, features = torch.zeros(1, 3, width), torch.zeros(1, 3, width)
    fuse = (lambda: network.slot_inputs(embeds, features)) if method == "msd" else (lambda: network.text_inputs(embeds, features))
    assert {d.type for d in devices_reaching(network.fc, fuse)} == {"meta"}
    positions = torch.arange(3)[None]
    def forward():
        return network(embeds, positions)
    assert {d.type for d in devices_reaching(network.layers[0] if method == "msd" else network.layer, forward)} == {"meta"}


def test_the_runtime_keeps_a_placed_network_where_it_is(tiny_captioner_folder):
    from transformers import AutoConfig

    text_config = AutoConfig.from_pretrained(tiny_captioner_folder).get_text_config()
    network = tiny_drafter("msd", text_config)
    drafter = runtime_drafter(network, device="meta")
    assert drafter.device == torch.device("meta") and next(network.parameters()).device.type == "meta"


@pytest.mark.parametrize("method", ["msd", "flash"])
def test_a_dispatched_target_with_its_drafters_placed_decodes_as_generate(zoo_like_folder, frames, method):
    """On one device the boundary is a no-op: the output is the whole model's greedy decoding."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    pipe = CaptionPipeline.from_pretrained(zoo_like_folder, device_map=WHOLE_ON_CPU, drafter_device=device)
    assert next(pipe.feature_drafters[method].parameters()).device.type == device
    whole = CaptionPipeline.from_pretrained(zoo_like_folder)
    expected = whole.model.generate(**whole.prepare_inputs(video=frames), do_sample=False, max_new_tokens=12)
    out = pipe(video=frames, max_new_tokens=12, method=method, progress_bar=False)
    assert out.sequences[0].tolist() == expected[0].tolist()
    assert out.stats.drafted > 0


def test_a_saved_pipeline_places_its_feature_drafters_too(zoo_like_folder, tmp_path):
    """A saved pipeline is moved whole by its loader first; the drafters are placed after, feature drafters included."""
    CaptionPipeline.from_pretrained(zoo_like_folder).save_pretrained(tmp_path / "saved")
    pipe = CaptionPipeline.from_pretrained(tmp_path / "saved", device_map=WHOLE_ON_CPU, drafter_device="meta")
    assert {"msd", "flash"} <= set(pipe.feature_drafters)
    for method in ("msd", "flash"):
        assert {p.device.type for p in pipe.feature_drafters[method].parameters()} == {"meta"}
        drafter = pipe.drafter_factories()[method]()
        drafter.bind(pipe.target)
        assert next(drafter.model.parameters()).device.type == "meta"
