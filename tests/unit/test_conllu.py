from __future__ import annotations

import pytest

from headscope.conllu import TreebankError, read_conllu

GOOD = """# sent_id = s1
# text = I don't like cats.
1\tI\tI\tPRON\t_\t_\t4\tnsubj\t_\t_
2-3\tdon't\t_\t_\t_\t_\t_\t_\t_\t_
2\tdo\tdo\tAUX\t_\t_\t4\taux\t_\t_
3\tn't\tnot\tPART\t_\t_\t4\tadvmod\t_\t_
4\tlike\tlike\tVERB\t_\t_\t0\troot\t_\t_
5\tcats\tcat\tNOUN\t_\t_\t4\tobj\t_\tSpaceAfter=No
5.1\tate\teat\tVERB\t_\t_\t_\t_\t4:conj\t_
6\t.\t.\tPUNCT\t_\t_\t4\tpunct\t_\t_

# sent_id = s2
1\tCats\tcat\tNOUN\t_\t_\t3\tnsubj:pass\t_\t_
2\twere\tbe\tAUX\t_\t_\t3\taux:pass\t_\t_
3\tfed\tfeed\tVERB\t_\t_\t0\troot\t_\tSpaceAfter=No
4\t.\t.\tPUNCT\t_\t_\t3\tpunct\t_\t_
"""


def write(tmp_path, text, name="t.conllu"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_ranges_empty_nodes_subtypes_and_spacing(tmp_path):
    treebank = read_conllu(write(tmp_path, GOOD))
    first, second = treebank.sentences
    assert first.text == "I don't like cats."
    assert [w.form for w in first.words] == ["I", "do", "n't", "like", "cats", "."]
    assert [first.text[w.start : w.end] for w in first.words] == ["I", "do", "n't", "like", "cats", "."]
    assert first.arcs({"nsubj", "obj"}) == [(0, 3, "nsubj"), (4, 3, "obj")]
    assert first.words[3].head == -1
    assert second.text == "Cats were fed."
    assert [w.deprel for w in second.words] == ["nsubj", "aux", "root", "punct"]
    assert second.words[0].full_deprel == "nsubj:pass"
    assert first.source.endswith("t.conllu:1") and second.source.endswith("t.conllu:12")


def test_shared_ewt_treebank_rebuilds_text(tmp_path):
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "shared/data/ud/UD_English-EWT/en_ewt-ud-test.conllu"
    if not path.exists():
        pytest.skip("shared UD data absent")
    treebank = read_conllu(path)
    assert len(treebank.sentences) == 2077
    assert sum(len(s.words) for s in treebank.sentences) == 25094
    texts = [line[len("# text = ") :].rstrip("\n") for line in path.open() if line.startswith("# text = ")]
    same = sum(s.text == t for s, t in zip(treebank.sentences, texts, strict=True))
    assert same >= 2070  # one EWT sentence has a no-break space in # text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1\tI\tI\tPRON\t_\t_\t0\troot\t_\n", r"t\.conllu:1: expected 10 tab-separated columns, found 9"),
        (
            "1\tI\tI\tPRON\t_\t_\t0\troot\t_\t_\n2\tgo\tgo\tVERB\t_\t_\t7\tdep\t_\t_\n",
            r"t\.conllu:2: HEAD 7 points outside",
        ),
        ("1\tI\tI\tPRON\t_\t_\tx\troot\t_\t_\n", r"HEAD 'x' is not a number"),
        ("1\tI\tI\tPRON\t_\t_\t1\troot\t_\t_\n", r"its own HEAD"),
        ("1\tI\tI\tPRON\t_\t_\t0\t_\t_\t_\n", r"DEPREL is empty"),
        ("2\tI\tI\tPRON\t_\t_\t0\troot\t_\t_\n", r"IDs must run 1, 2, 3"),
        ("# only a comment\n", r"no sentences"),
    ],
)
def test_malformed_treebanks(tmp_path, text, message):
    with pytest.raises(TreebankError, match=message):
        read_conllu(write(tmp_path, text))


def test_empty_file_and_skip_bad(tmp_path):
    from headscope.errors import PromptSetError

    with pytest.raises(PromptSetError, match="file is empty"):
        read_conllu(write(tmp_path, "", "empty.conllu"))
    bad_then_good = "1\tI\tI\tPRON\t_\t_\t9\troot\t_\t_\n\n" + GOOD
    with pytest.raises(TreebankError):
        read_conllu(write(tmp_path, bad_then_good))
    treebank = read_conllu(write(tmp_path, bad_then_good), skip_bad=True)
    assert len(treebank.sentences) == 2 and len(treebank.skipped) == 1
    assert "HEAD 9" in treebank.skipped[0]
    assert len(read_conllu(write(tmp_path, GOOD), limit=1).sentences) == 1


def test_shipped_sets_cover_the_required_relations():
    from headscope.prompts import builtin

    required = {"nsubj", "obj", "det", "amod", "advmod", "aux", "case", "mark"}
    for name in ("syntax/en.conllu", "syntax/zh.conllu"):
        treebank = read_conllu(builtin(name))
        assert len(treebank.sentences) >= 150
        found = {w.deprel for s in treebank.sentences for w in s.words}
        assert required <= found, (name, required - found)
