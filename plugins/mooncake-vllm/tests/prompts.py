"""Deterministic prompts: `long_prompt(seed)` is about 1,460 tokens of smollm2's tokenizer
(different seeds share no leading block), `short_prompts()` five distinct P/D prompts of
175-335 tokens (more than one KV block each)."""

from __future__ import annotations

import random

ANIMALS = ["otter", "heron", "badger", "lynx", "falcon", "marten", "ibex", "gecko"]
COLOURS = ["amber", "teal", "crimson", "ivory", "slate", "olive", "violet", "copper"]
CITIES = ["Lyon", "Porto", "Graz", "Turku", "Cork", "Split", "Ghent", "Bergen"]


def long_prompt(seed: int, facts: int = 70) -> str:
    rnd = random.Random(seed)
    lines = [f"Ledger {seed}. Read every record, then answer the question at the end."]
    for i in range(facts):
        lines.append(f"Record {i}: the {rnd.choice(COLOURS)} {rnd.choice(ANIMALS)} "
                     f"number {rnd.randrange(1000)} was seen in {rnd.choice(CITIES)}.")
    lines.append("Question: in which city was the last record seen? Answer:")
    return "\n".join(lines)


def short_prompts() -> list[str]:
    return [long_prompt(100 + i, facts=n) for i, n in enumerate((7, 9, 11, 13, 15))]
