"""transformers' own assisted generation with a text-only drafter, as a `mmspec bench vision` row.

`model.generate(..., assistant_model=assistant, do_sample=False)` is how a transformers user would
speed up a Video-LLM with a small text LM. Two things stand in the way, and this module does the
least it can about them:

- Vocabulary. A vision-language model usually appends its placeholders (`<video>`, `<image>`)
  after its language model's vocabulary, so the drafter (trained on text) is narrower than the
  target, and transformers' assisted generation needs equal widths (else it asks for two
  tokenizers and re-tokenises through text). `assistant_for` makes an assistant copy of the
  drafter with embeddings and LM head resized to the target's width: new embedding rows are the
  mean of the old ones (deterministic; transformers' own `mean_resizing` samples around it), and
  the LM head gets a bias of -inf on every visual id, so the assistant never drafts one. Its text
  logits are untouched; that is exactly the padding `TextOnlyDrafter` applies.
- Visual placeholders. transformers hands the assistant the same `input_ids` as the target (and
  the target's model kwargs, pixels included, which a text LM ignores), so the assistant reads
  the hundreds of placeholder tokens as tokens, embedded as above. mmspec's `TextOnlyDrafter`
  strips them instead. transformers offers no hook for that, so the row measures assisted
  generation as transformers does it, not as the Gagrani et al. drafter does.

The schedule is constant, `num_assistant_tokens = k`, and the confidence cut-off is off, so the
assistant drafts k tokens per round like mmspec's fixed-k rows.

Counting: target forwards with a forward hook on the target (one verification forward per round,
the first one over prompt + drafts), assistant forwards with one on the assistant. Each
assistant forward drafts exactly one token and each round commits its accepted drafts plus one
token of the target's, so drafted = assistant forwards and accepted = new tokens - target
forwards (transformers truncates a round at EOS or the length limit before committing).
"""

from __future__ import annotations

import copy
import time

import torch
from transformers import PreTrainedModel

from ..bench.harness import ForwardCounter, MethodFn, quiet_transformers
from ..cached_model import model_vocab_size
from ..errors import MMSpecError
from ..stats import SpecStats
from .models import visual_token_ids

NOTE = ("transformers' assisted generation (`generate(assistant_model=..., do_sample=False)`, constant schedule of k "
        "draft tokens, confidence cut-off off) with the text-only drafter resized to the target's vocabulary (visual "
        "ids never drafted): unlike mmspec's text-only drafter, transformers feeds the assistant the full prompt, so it "
        "reads every visual placeholder as a token; alpha = (new tokens - target forwards) / assistant forwards")


def assistant_for(drafter: PreTrainedModel, target: PreTrainedModel) -> PreTrainedModel:
    """A copy of `drafter` that transformers accepts as `assistant_model=` for `target`.

    Widened to the target's vocabulary when the ids it lacks are all visual tokens; every visual
    id gets a logit of -inf. Raises `MMSpecError` (with the reason) when that is impossible.
    """
    if drafter.config.is_encoder_decoder:
        raise MMSpecError("the drafter is an encoder-decoder model; assisted generation here needs a decoder-only LM")
    visual = visual_token_ids(target)
    width, own = model_vocab_size(target), model_vocab_size(drafter)
    missing = set(range(own, width))
    if own > width:
        raise MMSpecError(f"the drafter's vocabulary ({own}) is wider than the target's ({width}): transformers would "
                          "need both tokenizers and re-tokenise through text")
    if not missing <= visual:
        raise MMSpecError(f"the drafter's vocabulary ({own}) lacks target ids that are not visual tokens "
                          f"({len(missing - visual)} of them): the two do not share a vocabulary")
    assistant = copy.deepcopy(drafter).eval()
    head = assistant.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear):
        raise MMSpecError(f"the drafter's LM head is a {type(head).__name__}, not a linear layer: cannot mask visual ids")
    if missing:
        assistant.resize_token_embeddings(width, mean_resizing=False)
        with torch.no_grad():
            embeddings = assistant.get_input_embeddings().weight
            embeddings[own:] = embeddings[:own].mean(0)
        head = assistant.get_output_embeddings()
    with torch.no_grad():
        bias = head.bias.detach().clone() if head.bias is not None else torch.zeros(
            head.out_features, dtype=head.weight.dtype, device=head.weight.device)
        bias[sorted(i for i in visual if i < head.out_features)] = float("-inf")
        masked = torch.nn.Linear(head.in_features, head.out_features, bias=True, device="meta")
        masked.weight = head.weight  # shared: a tied LM head stays tied to the embeddings
        masked.bias = torch.nn.Parameter(bias, requires_grad=False)
    assistant.set_output_embeddings(masked)
    sizes = (assistant.config.get_text_config().vocab_size, target.config.get_text_config().vocab_size)
    if model_vocab_size(assistant) != width or sizes[0] != sizes[1]:
        # transformers compares the configs' vocab sizes and wants two tokenizers when they differ.
        raise MMSpecError(f"the resized drafter's vocabulary (head {model_vocab_size(assistant)}, config {sizes[0]}) does "
                          f"not match the target's (head {width}, config {sizes[1]})")
    return assistant


def hf_assisted(model: PreTrainedModel, assistant: PreTrainedModel, k: int, max_new_tokens: int,
                counter: ForwardCounter, assistant_counter: ForwardCounter) -> MethodFn:
    """A bench method: transformers' greedy assisted generation with `assistant`, k drafts per round.

    `counter` hooks the target, `assistant_counter` the assistant (see the module docstring).
    """

    def run(item) -> tuple[list[int], SpecStats]:
        # Set on every call: transformers reads these from the assistant's own generation config.
        config = assistant.generation_config
        config.num_assistant_tokens, config.num_assistant_tokens_schedule = k, "constant"
        config.assistant_confidence_threshold = 0.0  # off (transformers' default is 0.4)
        counter.take()
        assistant_counter.take()
        start = time.perf_counter()
        with quiet_transformers():
            out = model.generate(item.input_ids, do_sample=False, max_new_tokens=max_new_tokens, assistant_model=assistant,
                                 **item.model_inputs)
        stats = SpecStats(method="hf-assisted", total_time=time.perf_counter() - start)
        stats.new_tokens = out.shape[1] - item.input_ids.shape[1]
        stats.target_forwards = counter.take()
        stats.drafter_forwards = stats.drafted = assistant_counter.take()
        stats.rounds = stats.target_forwards
        stats.accepted = stats.new_tokens - stats.target_forwards
        return out[0, item.input_ids.shape[1]:].tolist(), stats

    return run
