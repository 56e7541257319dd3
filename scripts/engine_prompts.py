"""Write a prompt set for recording real traces as a small JSONL of excerpt specs.

Each line names a module of the Python standard library or of an installed package (numpy), a
byte range of its source file (cut at line boundaries) with the excerpt's sha256, and a task:
a question about the code (chat-formatted) or a plain continuation. No text is stored;
``specsim trace --prompts FILE`` reads the excerpts at run time. Sets
(``specsim.engine.prompts.PROMPT_SETS``), deterministic for a given Python and numpy version:
``default``, the shipped traces' 12 excerpts of ~2K–6K tokens for SmolLM2's tokenizer;
``extended``, those and 36 more; ``long``, 41 excerpts fitted to 7.1K–7.9K tokens (the
SmolLM2 8K table's prompts).

    python scripts/engine_prompts.py [--out prompts.jsonl] [--set default|extended|long] \\
        [--tokenizer MODEL_FOLDER]
"""
from __future__ import annotations

import argparse

from specsim.engine import prompts as P


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="prompts.jsonl")
    parser.add_argument("--set", default="default", choices=sorted(P.PROMPT_SETS),
                        help="default: the shipped traces' 12; extended: those and 36 more; "
                             "long: 41 of 7.1K-7.9K tokens")
    parser.add_argument("--tokenizer", default=None,
                        help="Model folder whose tokenizer counts the prompt tokens "
                             "(e.g. ~/.cache/specsim/models/smollm2-135m).")
    args = parser.parse_args(argv)
    specs = P.default_specs(args.set)
    P.write_prompt_file(args.out, specs)
    tokenizer = P.Tokenizer(args.tokenizer) if args.tokenizer else None
    for spec in specs:
        size = f"{spec.end - spec.start} bytes"
        if tokenizer is not None:
            size += f", {len(P.prompt_tokens(spec, tokenizer))} tokens"
        print(f"{spec.id:24s} {P.module_file(spec.module).name:20s} {spec.task:9s} {size}")
    print(f"wrote {len(specs)} prompts to {args.out}")


if __name__ == "__main__":
    main()
