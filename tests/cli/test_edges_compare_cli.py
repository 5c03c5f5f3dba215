"""`headscope compare` at its edges (issue 39): scans of different layouts are refused in one line,
exit 2; r is Spearman's rank correlation; a table in one scan only is named in a note."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HEADER = "model,detector,relation,direction,layer,head,score\n"


def headscope(*args: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("headscope")
    return subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True, timeout=300)


def scan_csv(path: Path, rows: list[tuple[str, int, int, float]]) -> Path:
    path.write_text(HEADER + "".join(f"m,{d},,,{layer},{head},{score}\n" for d, layer, head, score in rows))
    return path


def test_compare_refuses_two_layouts_in_one_line(tmp_path):
    a = scan_csv(
        tmp_path / "a.csv", [("induction", layer, head, 0.1) for layer in range(2) for head in range(4)]
    )
    b = scan_csv(
        tmp_path / "b.csv", [("induction", layer, head, 0.1) for layer in range(3) for head in range(2)]
    )
    done = headscope("compare", a, b)
    assert done.returncode == 2 and done.stdout == ""
    assert "A has 2 layers x 4 heads, B has 3 layers x 2 heads" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_compare_gives_spearman_and_names_unpaired_tables(tmp_path):
    heads = [(0, 0), (0, 1), (1, 0), (1, 1)]
    a = scan_csv(
        tmp_path / "a.csv", [("induction", *h, s) for h, s in zip(heads, (0.1, 0.2, 0.3, 0.4), strict=True)]
    )
    b_rows = [("induction", *h, s) for h, s in zip(heads, (0.01, 0.02, 0.9, 0.03), strict=True)]
    b = scan_csv(tmp_path / "b.csv", [*b_rows, ("sink", 0, 0, 0.9)])
    done = headscope("compare", a, b, "--format", "json")
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    (induction,) = [t for t in found["tables"] if t["detector"] == "induction"]
    assert abs(induction["correlation"] - 0.8) < 1e-12  # Pearson would give about 0.28
    assert found["notes"] == ["only in B, not compared: sink"]
    text = headscope("compare", a, b)
    assert "Spearman rank correlation" in text.stdout and "note: only in B, not compared: sink" in text.stdout
