"""The compiled, static-shape path (`compile=True`): a target that verifies a fixed k + 1 positions per round and a
model drafter that drafts in fixed one-token steps, each over a static KV cache (`mmspec.static_steps`).

The loop is the same as the eager path's; only the shapes are fixed, so each forward compiles to one graph
(CUDA graphs on a GPU, inductor on a CPU). Greedy output is the target's `generate` output, as everywhere.
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Callable
from typing import Any

from transformers import PreTrainedModel

from .cached_model import CachedModel
from .drafters import Drafter, ModelDrafter, NoDrafter
from .errors import MMSpecError
from .policies import DraftLengthPolicy, HeuristicDraftLength
from .static_steps import StaticSteps
from .static_trees import StaticTreeSteps
from .targets import TARGET_FACTORIES, Target, as_target, load_adapters
from .trees import TreeConfig

# A drafter catches up on one token (a rejected round: the correction) or two (a fully accepted one: the last
# draft and the bonus token), then drafts one token per forward.
DRAFTER_WIDTHS = (1, 2)
# The torch.compile backend `compile=True` uses ("eager" captures the same graphs without generating code: tests).
DEFAULT_BACKEND = "inductor"


def verify_widths(policy: DraftLengthPolicy) -> tuple[int, ...]:
    """The verification widths (drafts + 1) a policy's rounds are padded to: its k + 1, and for a growing policy
    powers of two up to its largest k + 1, so a short round is not padded to the longest one."""
    first = policy.fresh().max_tokens() + 1
    largest = (policy.max_num_tokens if isinstance(policy, HeuristicDraftLength) else first - 1) + 1
    widths = {first, largest}
    width = 1
    while width < largest:
        if width > first:
            widths.add(width)
        width *= 2
    return tuple(sorted(widths))


class StaticTarget(StaticTreeSteps, StaticSteps, Target):
    """A `Target` over a static cache whose verification forwards (k + 1 tokens, padded) run compiled.

    `widths`: the verification widths to compile (default 6: k = 5); `max_cache_len`: the cache size to start
    with (it grows, with a recompile, when a call needs more); `backend` / `mode`: as `torch.compile` takes them;
    `tree_width`: the width draft-tree verifications (root + nodes) are padded to and compiled at
    (`mmspec.static_trees`; unset: trees are verified at their own width, eagerly, over the static cache).
    """

    decodes_batches = False

    def __init__(self, model: PreTrainedModel, widths: tuple[int, ...] = (6,), max_cache_len: int | None = None,
                 backend: str = "inductor", mode: str | None = None, tree_width: int | None = None) -> None:
        Target.__init__(self, model)
        # The certified head takes hidden states from a head-less forward: one more graph for a CPU trick that
        # compiled logits do not need.
        self.use_certified_head = False
        self.setup_static(widths, max_cache_len, backend, mode)
        self.setup_tree(tree_width)


def refuse_trees(self: Target) -> None:
    raise MMSpecError(f"compile=True verifies chains on {type(self.model).__name__}; draft trees only on plain text "
                      "targets (leave compile off or tree unset)")


class StaticCachedModel(StaticSteps, CachedModel):
    """A drafter's `CachedModel` over a static cache, its one- and two-token steps compiled."""

    def __init__(self, model: PreTrainedModel, widths: tuple[int, ...] = DRAFTER_WIDTHS, max_cache_len: int | None = None,
                 backend: str = "inductor", mode: str | None = None) -> None:
        CachedModel.__init__(self, model, role="drafter")
        self.setup_static(widths, max_cache_len, backend, mode)


def drafter_widths(tree: TreeConfig | None) -> tuple[int, ...]:
    """A drafter's step widths: catching up and chain steps, and with a tree, its levels (up to top_k nodes each)."""
    return DRAFTER_WIDTHS if tree is None else tuple(sorted({*DRAFTER_WIDTHS, tree.top_k}))


class StaticModelDrafter(ModelDrafter):
    """`ModelDrafter` whose steps run compiled over a static cache (one sequence: chains, or trees whose levels are
    padded to the widest of `widths`, see `drafter_widths`)."""

    def __init__(self, model: PreTrainedModel, max_cache_len: int | None = None, backend: str = "inductor",
                 mode: str | None = None, widths: tuple[int, ...] = DRAFTER_WIDTHS) -> None:
        super().__init__(model, lean=False)
        self.lm = StaticCachedModel(model, widths=widths, max_cache_len=max_cache_len, backend=backend, mode=mode)

    @property
    def drafts_batches(self) -> bool:  # type: ignore[override]
        return False


def static_target_for(model: PreTrainedModel, widths: tuple[int, ...] = (6,), max_cache_len: int | None = None,
                      backend: str = "inductor", mode: str | None = None) -> Target:
    """The static variant of the target `as_target(model)` would give: `StaticTarget` for a plain model, the same
    static steps over its adapter's `Target` subclass for the others (e.g. the vision adapter's, whose prefill
    handles image placeholders; its incremental steps are plain text)."""
    kind = registered_target_class(model)
    if kind is Target:
        return StaticTarget(model, widths, max_cache_len, backend, mode)
    if not (isinstance(kind, type) and issubclass(kind, Target)):
        raise MMSpecError(f"compile=True cannot wrap {type(model).__name__}: its adapter builds its target another way")
    target = static_variant(kind)(model)
    target.use_certified_head = False
    target.setup_static(widths, max_cache_len, backend, mode)
    return target


_VARIANTS: dict[type, type] = {}


def static_variant(kind: type[Target]) -> type:
    """`kind` with the static steps in front: its own prefill inputs and processing, fixed-width compiled steps."""
    if kind not in _VARIANTS:
        _VARIANTS[kind] = type(f"Static{kind.__name__}", (StaticSteps, kind), {
            "__module__": __name__, "decodes_batches": False, "check_tree_support": refuse_trees})
    return _VARIANTS[kind]


def static_model_drafter(drafter: ModelDrafter, max_cache_len: int | None = None, backend: str = "inductor",
                         mode: str | None = None, widths: tuple[int, ...] = DRAFTER_WIDTHS) -> ModelDrafter:
    """A copy of a `ModelDrafter` (any subclass: its own choices and masks stay) whose model steps run compiled
    over a static cache."""
    if isinstance(drafter.lm, StaticSteps):
        return drafter
    if type(drafter.lm) is not CachedModel:
        raise MMSpecError(f"compile=True cannot compile {type(drafter).__name__}'s own model wrapper; leave compile off")
    static = copy.copy(drafter)
    # Shared by every drafter of this model (pipelines make a fresh drafter per call): one set of graphs and caches.
    static.lm = _shared(drafter.lm.model, ("drafter-lm", max_cache_len, backend, mode, widths),
                        lambda m: StaticCachedModel(m, widths=widths, max_cache_len=max_cache_len, backend=backend, mode=mode))
    return static


# The attribute a model (or drafter) keeps its static wrappers under.
_WRAPPERS_ATTRIBUTE = "_mmspec_static_wrappers"


class StaticWrappers(dict):
    """An object's static wrappers by key. Calls with the same model (or drafter) reuse one wrapper, and with it the
    compiled graphs and the static caches (a fresh cache would be new tensors, which recompiles the graph).

    The table lives on the object itself, not in a process-wide one: a wrapper holds its model, so a global table
    (even one with weak keys) would keep every model alive; here the model and its wrappers are one cycle, freed
    with the model's last outside reference. Copies and pickles of the model start without wrappers (those belong
    to the original: `owner`)."""

    def __init__(self, owner: Any = None) -> None:
        super().__init__()
        self.owner = None if owner is None else weakref.ref(owner)

    def __copy__(self) -> StaticWrappers:
        return StaticWrappers()

    def __deepcopy__(self, memo: dict[int, Any]) -> StaticWrappers:
        return StaticWrappers()

    def __reduce__(self) -> tuple[Any, ...]:
        return StaticWrappers, ()


def static_wrappers(key_object: Any) -> StaticWrappers:
    """The static wrappers `compile=True` made for a model (or drafter) so far (empty: none)."""
    wrappers = getattr(key_object, _WRAPPERS_ATTRIBUTE, None)
    if isinstance(wrappers, StaticWrappers) and wrappers.owner is not None and wrappers.owner() is key_object:
        return wrappers
    return StaticWrappers()


def _shared(key_object: Any, key: tuple, make: Callable[[Any], Any]) -> Any:
    wrappers = static_wrappers(key_object)
    if wrappers.owner is None:
        wrappers = StaticWrappers(key_object)
        # Not `setattr`: a module's own __setattr__ sorts values into parameters, buffers and submodules.
        object.__setattr__(key_object, _WRAPPERS_ATTRIBUTE, wrappers)
    if key not in wrappers:
        wrappers[key] = make(key_object)
    return wrappers[key]


def compiled_pair(target: PreTrainedModel | Target, drafter: PreTrainedModel | Drafter, policy: DraftLengthPolicy,
                  tree: TreeConfig | None = None) -> tuple[PreTrainedModel | Target, PreTrainedModel | Drafter]:
    """`compile=True`: the static-shape target and drafter for a target model and a drafter.

    A target or drafter that is already static passes through; a drafter without a model of its own (prompt
    lookup, Jacobi, feature drafters) drafts as before. The target is a transformers model, or the `Target` the
    model's adapter builds from it alone (a pipeline's); another `Target` may carry behaviour this path would lose.

    With `tree`, a plain text target verifies each tree padded to num_nodes + 1 positions (`mmspec.static_trees`),
    and a model drafter feeds each level of its tree padded to top_k nodes."""
    if tree is not None:
        if not is_static(target):
            model = target.model if type(target) is Target else target
            if not isinstance(model, PreTrainedModel) or registered_target_class(model) is not Target:
                raise MMSpecError(f"compile=True verifies chains on {type(model).__name__}; draft trees only on plain "
                                  "text targets (leave compile off or tree unset)")
            widths = verify_widths(policy)
            target = _shared(model, ("target", widths, tree.num_nodes + 1), lambda m: StaticTarget(
                m, widths, backend=DEFAULT_BACKEND, tree_width=tree.num_nodes + 1))
        return target, _static_drafter(drafter, drafter_widths(tree))
    if not is_static(target):
        widths = (1,) if isinstance(drafter, NoDrafter) else verify_widths(policy)  # plain decoding: one token a step
        model = target.model if isinstance(target, Target) else target
        load_adapters()  # adapters register their static targets as they load
        factory = STATIC_TARGET_FACTORIES.get(getattr(getattr(model, "config", None), "model_type", ""))
        if factory is not None:  # an adapter's own static target (e.g. Whisper's encoder-decoder caches)
            return factory(as_target(target), widths, DEFAULT_BACKEND), _static_drafter(drafter)
        if isinstance(target, Target) and type(target) in (Target, registered_target_class(target.model)):
            target = target.model  # built from the model alone: its static variant is the same target
        if not isinstance(target, PreTrainedModel):
            raise MMSpecError(f"compile=True takes a transformers model as the target, got {type(target).__name__}")
        target = _shared(target, ("target", widths), lambda m: static_target_for(m, widths, backend=DEFAULT_BACKEND))
    return target, _static_drafter(drafter)


def _static_drafter(drafter: PreTrainedModel | Drafter, widths: tuple[int, ...] = DRAFTER_WIDTHS
                    ) -> PreTrainedModel | Drafter:
    if isinstance(drafter, PreTrainedModel):
        key = ("drafter",) if widths == DRAFTER_WIDTHS else ("drafter", widths)
        return _shared(drafter, key, lambda m: StaticModelDrafter(m, backend=DEFAULT_BACKEND, widths=widths))
    if isinstance(drafter, ModelDrafter):
        return static_model_drafter(drafter, backend=DEFAULT_BACKEND, widths=widths)
    return drafter


# model_type -> factory(the adapter's target for the call, the policy's verify widths, backend) -> its static twin.
# Adapters whose models need more than `StaticSteps` (encoder-decoder caches) register one, as they register targets.
StaticTargetFactory = Callable[[Target, tuple[int, ...], str], Target]
STATIC_TARGET_FACTORIES: dict[str, StaticTargetFactory] = {}


def register_static_target(model_type: str, factory: StaticTargetFactory) -> None:
    STATIC_TARGET_FACTORIES[model_type] = factory


def is_static(target: Any) -> bool:
    """Whether a target already runs the static-shape path (the core's steps, or an adapter's `static_shapes`)."""
    return isinstance(target, StaticSteps) or bool(getattr(target, "static_shapes", False))


def registered_target_class(model: PreTrainedModel) -> Any:
    load_adapters()
    return TARGET_FACTORIES.get(getattr(model.config, "model_type", ""), Target)
