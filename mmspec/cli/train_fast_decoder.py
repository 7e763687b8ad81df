"""`mmspec train-fast-decoder`: a CTC or one-layer AR fast decoder on a Whisper model's frozen encoder."""

from __future__ import annotations

import argparse

from . import checks
from .common import SharedFlags, set_threads
from .model_checks import check_model


def register(commands: argparse._SubParsersAction, flags: SharedFlags) -> None:
    parser = commands.add_parser("train-fast-decoder", parents=[flags.seed, flags.threads],
                                 help="train a fast decoder (CTC or one-layer AR) on a Whisper model's frozen encoder, "
                                      "for hybrid decoding")
    parser.add_argument("--target", required=True, help="zoo name, local folder or Hub id of the Whisper model")
    parser.add_argument("--data", required=True, type=checks.existing_folder,
                        help='folder with metadata.jsonl ({"file": ..., "text": ...} per line) + clips')
    parser.add_argument("--out", required=True, type=checks.output_folder,
                        help="folder to save_pretrained into (e.g. MODEL/fast_decoder, MODEL/ar_fast_decoder)")
    parser.add_argument("--kind", choices=["ctc", "ar"], default="ctc",
                        help="ctc = non-autoregressive CTC head; ar = one-layer WhisperForCausalLM (also an HF assistant)")
    parser.add_argument("--labels", choices=["target", "truth"], default="target",
                        help="target = the model's own greedy transcripts (distillation); truth = the metadata text")
    parser.add_argument("--steps", type=checks.positive_int, default=1000)
    parser.add_argument("--batch-size", type=checks.positive_int, default=16)
    parser.add_argument("--lr", type=checks.positive_float, default=None, help="learning rate (default: 1e-3 for ctc, 5e-4 for ar)")
    parser.add_argument("--init-from", default=None, help="a saved fast decoder of the same kind to continue training")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..speech.clip_folder import read_clip_folder

    read_clip_folder(args.data)  # the data and the models, checked before torch is imported
    check_model(args.target, "target", "speech")
    check_model(args.init_from, "fast decoder", "fast-decoder")
    from ..speech.train_fast import train_from_folder

    set_threads(args)
    report = train_from_folder(args.target, args.data, args.out, kind=args.kind, labels=args.labels, steps=args.steps,
                               batch_size=args.batch_size, learning_rate=args.lr, seed=args.seed, init_from=args.init_from)
    print(f"saved the {report.kind} fast decoder to {report.out} ({report.clips} clips, {report.labels} labels, "
          f"{report.steps} steps, loss {report.first_loss:.3f} -> {report.final_loss:.3f}, {report.seconds:.0f} s)")
    return 0
