"""Visual autoregressive models (LlamaGen-style) and their speculative methods: SJD, GSD, LANTERN;
next-scale VAR with CoDe."""

from transformers import AutoConfig, AutoModel

from .bench import bench_image
from .code import CoDeOutput, code_generate
from .decode import ar_generate, decode_grids
from .draft_generate import GuidedImageDrafter, draft_generate, lantern_rule
from .image_stats import ScaleRecord, ScaleStats, StepStats, WindowRecord
from .jacobi import GridJacobiDrafter, jacobi_generate
from .janus import JanusCFGTarget, janus_generate
from .janus_pipeline import JanusImagePipeline
from .llamagen import LlamaGenCache, LlamaGenConfig, LlamaGenForClassConditional, tiny_llamagen
from .mar_pipeline import MARPipeline
from .methods import METHODS, MethodConfig, MethodRunner
from .pipeline import ImagePipeline, SpeculativeImagePipeline
from .pipeline_common import ImageGenerationOutput
from .rules import (
    Decision,
    gsd_accept,
    gsd_group_mask,
    lantern_accept,
    lantern_neighbours,
    lantern_output_law,
    sjd_accept,
)
from .target import CFGTarget, GuidedImageTarget, ImageTokensOutput
from .var import VAR, VARSampling, VARState, tiny_var
from .var_pipeline import VARPipeline
from .var_vq import VQVAE, tiny_var_vq
from .vq import VQConfig, VQModel, tiny_vq

for _config, _model in ((LlamaGenConfig, LlamaGenForClassConditional), (VQConfig, VQModel)):
    try:
        AutoConfig.register(_config.model_type, _config)
        AutoModel.register(_config, _model)
    except ValueError:  # already registered (module reloaded)
        pass

__all__ = [
    "CFGTarget",
    "CoDeOutput",
    "Decision",
    "GridJacobiDrafter",
    "GuidedImageDrafter",
    "GuidedImageTarget",
    "ImageGenerationOutput",
    "ImagePipeline",
    "ImageTokensOutput",
    "JanusCFGTarget",
    "JanusImagePipeline",
    "LlamaGenCache",
    "LlamaGenConfig",
    "LlamaGenForClassConditional",
    "MARPipeline",
    "METHODS",
    "MethodConfig",
    "MethodRunner",
    "ScaleRecord",
    "ScaleStats",
    "SpeculativeImagePipeline",
    "StepStats",
    "VAR",
    "VARPipeline",
    "VARSampling",
    "VARState",
    "VQVAE",
    "VQConfig",
    "VQModel",
    "WindowRecord",
    "ar_generate",
    "bench_image",
    "code_generate",
    "decode_grids",
    "draft_generate",
    "gsd_accept",
    "gsd_group_mask",
    "jacobi_generate",
    "janus_generate",
    "lantern_accept",
    "lantern_neighbours",
    "lantern_output_law",
    "lantern_rule",
    "sjd_accept",
    "tiny_llamagen",
    "tiny_var",
    "tiny_var_vq",
    "tiny_vq",
]
