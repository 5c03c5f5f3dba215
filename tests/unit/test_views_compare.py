"""Word segmentation and head parsing for `show`, fonts for PNGs, and the scan-CSV comparison."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from headscope.errors import InputError
from headscope.extend.show import parse_heads, split_marked, word_spans
from headscope.outputs.compare import CompareInputError, compare, read_scan_csv
from headscope.outputs.views import font_for


def words(text: str) -> list[str]:
    return [text[s:e] for s, e in word_spans(text)]


def test_word_spans_latin_cjk_marks_and_emoji():
    assert words("The dog's bone, isn't it?") == ["The", "dog's", "bone", ",", "isn't", "it", "?"]
    assert words("我喜欢这幅画。") == ["我", "喜", "欢", "这", "幅", "画", "。"]
    assert words("naïve cafe\u0301 ok") == ["naïve", "cafe\u0301", "ok"]  # a combining accent stays
    family = "👩\u200d👩\u200d👧"
    assert words(f"hi {family}!") == ["hi", family, "!"]  # a ZWJ sequence is one word
    assert words("GPT-4 在 2024") == ["GPT", "-", "4", "在", "2024"]


def test_split_marked_gives_exact_word_spans():
    text, spans = split_marked("我|喜欢|这幅|画", "|")
    assert text == "我喜欢这幅画"
    assert [text[s:e] for s, e in spans] == ["我", "喜欢", "这幅", "画"]
    text, spans = split_marked("the big| dog", "|")
    assert [text[s:e] for s, e in spans] == ["the big", "dog"]
    with pytest.raises(InputError):
        split_marked("||", "|")


def test_parse_heads():
    assert parse_heads("3", 9) == [3]
    assert parse_heads("0, 2,5,2", 9) == [0, 2, 5]
    assert parse_heads("all", 4) == [0, 1, 2, 3]
    for bad in ("9", "-1", "x", "1,,y", ""):
        with pytest.raises(InputError, match="--head"):
            parse_heads(bad, 9)
    assert parse_heads("12", None) == [12]  # syntax only, before the model is known


def test_font_for_reports_missing_glyphs():
    path, missing = font_for(["cat", "sat"])
    assert path is not None and missing == []
    path, missing = font_for(["\U000f0000"])  # a private-use code point no font has
    assert path is None and missing == ["\U000f0000"]


def scan_rows(model: str, scores: dict[tuple[int, int], float], roles: set[tuple[int, int]]) -> pd.DataFrame:
    rows = []
    for (layer, head), score in scores.items():
        rows.append(
            {
                "model": model,
                "detector": "induction",
                "relation": "",
                "direction": "",
                "data": "repeated-tokens",
                "layer": layer,
                "head": head,
                "score": score,
                "ci_low": score - 0.1,
                "ci_high": score + 0.1,
                "role": "ind" if (layer, head) in roles else "",
            }
        )
    return pd.DataFrame(rows)


def test_compare_is_exact_on_known_changes():
    # One layout (3 layers x 2 heads) on both sides, heads missing on either: heads pair by position.
    a = scan_rows("A", {(0, 0): 0.1, (0, 1): 0.2, (1, 0): 0.9, (1, 1): 0.5, (2, 1): 0.3}, {(1, 0)})
    b = scan_rows("B", {(0, 0): 0.1, (0, 1): 0.6, (1, 0): 0.4, (2, 0): 0.95}, {(0, 1), (2, 0)})
    result = compare(a, b)
    (table,) = result.tables
    assert table.best_a == (1, 0, 0.9) and table.best_b == (2, 0, 0.95)
    assert table.n_common == 3
    assert table.mean_delta == pytest.approx((0.0 + 0.4 - 0.5) / 3)
    assert table.biggest_rise == (0, 1, pytest.approx(0.4))
    assert table.biggest_fall == (1, 0, pytest.approx(-0.5))
    assert table.gained == [(0, 1)] and table.lost == [(1, 0)]
    keys = zip(result.joined.layer, result.joined["head"], strict=True)
    changes = dict(zip(keys, result.joined.change, strict=True))
    assert changes[(1, 1)] == "only in A" and changes[(2, 0)] == "only in B"
    assert math.isnan(result.joined.set_index(["layer", "head"]).loc[(2, 0), "score_a"])


def write(tmp_path, name: str, data: bytes):
    path = tmp_path / name
    path.write_bytes(data)
    return path


HEADER = b"model,detector,relation,direction,layer,head,score\n"


@pytest.mark.parametrize(
    ("name", "data", "needle"),
    [
        ("empty.csv", b"", "empty file"),
        ("blank.csv", b"\n\n", "empty file"),
        ("bin.csv", b"PK\x03\x04\x00\x00", "binary"),
        ("cols.csv", b"model,layer\nm,0\n", "missing column(s) detector"),
        ("short.csv", HEADER + b"m,ind,,,0,0,0.5\nm,ind,,,0,1\n", "short.csv:3: 6 fields"),
        ("nan.csv", HEADER + b"m,ind,,,0,0,nan\n", "nan.csv:2: score is nan"),
        ("word.csv", HEADER + b"m,ind,,,0,0,high\n", "'high' is not a number"),
        ("neg.csv", HEADER + b"m,ind,,,-1,0,0.5\n", "layer -1 is negative"),
        ("dup.csv", HEADER + b"m,ind,,,0,0,0.5\nm,ind,,,0,0,0.6\n", "dup.csv:3: the same head as line 2"),
        ("latin.csv", HEADER + b"m\xe9,ind,,,0,0,0.5\n", "latin.csv:2: not UTF-8"),
        ("header.csv", HEADER, "a header but no rows"),
        ("quote.csv", HEADER + b'm,"ind,,,0,0,0.5\n', "quote.csv"),
    ],
)
def test_read_scan_csv_rejects_bad_files(tmp_path, name, data, needle):
    with pytest.raises(CompareInputError, match=None) as info:
        read_scan_csv(write(tmp_path, name, data))
    assert needle in str(info.value)
