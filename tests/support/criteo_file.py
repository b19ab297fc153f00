"""Small Criteo TSV files with known contents, malformed lines included."""

from __future__ import annotations

from pathlib import Path

MALFORMED = [
    "1\t2\t3",  # too few fields
    "2\t" + "\t".join(["1"] * 13) + "\t" + "\t".join(["a1"] * 26),  # label not 0/1
    "0\t" + "\t".join(["1"] * 13) + "\t" + "\t".join(["zz"] * 26),  # not hex
    "1\t" + "\t".join(["x"] * 13) + "\t" + "\t".join(["a1"] * 26),  # dense not an integer
]


def write_criteo_file(path: Path, lines: int, malformed_every: int = 13) -> list[bool]:
    """Write ``lines`` lines; line n is malformed when ``n % malformed_every == 5``. A valid
    line's categorical values come from a handful per feature, so a few ids are hot.
    Returns which lines are valid."""
    valid, text = [], []
    for n in range(lines):
        if n % malformed_every == 5:
            text.append(MALFORMED[n % len(MALFORMED)])
            valid.append(False)
            continue
        dense = [str((n * 7 + f) % 50) if (n + f) % 9 else "" for f in range(13)]
        sparse = [format(0xA0 + (n * (f + 1)) % 3, "x") if (n + f) % 11 else "" for f in range(26)]
        text.append("\t".join([str(n // 3 % 2), *dense, *sparse]))
        valid.append(True)
    path.write_text("\n".join(text) + "\n")
    return valid
