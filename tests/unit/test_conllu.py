from __future__ import annotations

import pytest
import torch
from conftest import require_shared

from headscope.data.conllu import TreebankError, read_conllu

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


def test_shared_ewt_treebank_reads_its_text():
    path = require_shared("ud/UD_English-EWT/en_ewt-ud-test.conllu")
    treebank = read_conllu(path)
    # The published size of the EWT test split (shared/data/README.md).
    assert len(treebank.sentences) == 2077
    assert sum(len(s.words) for s in treebank.sentences) == 25094
    texts = [line[len("# text = ") :].rstrip("\n") for line in path.open() if line.startswith("# text = ")]
    # Every sentence's text is its own '# text' line, no-break space and all, and every word's
    # span spells its form (English multiword tokens concatenate: "don't" = "do" + "n't").
    assert [s.text for s in treebank.sentences] == texts
    assert all(s.text[w.start : w.end] == w.form for s in treebank.sentences for w in s.words)


SPANISH = """# sent_id = es1
# text = Vengo del mercado, dámelo.
1\tVengo\tvenir\tVERB\t_\t_\t0\troot\t_\t_
2-3\tdel\t_\t_\t_\t_\t_\t_\t_\t_
2\tde\tde\tADP\t_\t_\t4\tcase\t_\t_
3\tel\tel\tDET\t_\t_\t4\tdet\t_\t_
4\tmercado\tmercado\tNOUN\t_\t_\t1\tobl\t_\tSpaceAfter=No
5\t,\t,\tPUNCT\t_\t_\t6\tpunct\t_\t_
6-8\tdámelo\t_\t_\t_\t_\t_\t_\t_\tSpaceAfter=No
6\tda\tdar\tVERB\t_\t_\t1\tparataxis\t_\t_
7\tme\tyo\tPRON\t_\t_\t6\tiobj\t_\t_
8\tlo\tél\tPRON\t_\t_\t6\tobj\t_\t_
9\t.\t.\tPUNCT\t_\t_\t1\tpunct\t_\t_
"""


@pytest.mark.parametrize("with_text_line", [True, False])
def test_multiword_tokens_keep_their_surface_form(tmp_path, with_text_line):
    """Spanish "del" is "de" + "el": the text says "del" and both words share its characters."""
    data = SPANISH if with_text_line else SPANISH.replace("# text = Vengo del mercado, dámelo.\n", "")
    (sentence,) = read_conllu(write(tmp_path, data)).sentences
    assert sentence.text == "Vengo del mercado, dámelo."
    spans = {w.form: (w.start, w.end) for w in sentence.words}
    assert spans["de"] == spans["el"] == (6, 9) and sentence.text[6:9] == "del"
    assert spans["da"] == spans["me"] == spans["lo"] == (19, 25) and sentence.text[19:25] == "dámelo"
    assert sentence.text[slice(*spans["mercado"])] == "mercado"
    assert sentence.text[slice(*spans["."])] == "."
    assert sentence.arcs({"case", "det", "obj"}) == [(1, 3, "case"), (2, 3, "det"), (7, 5, "obj")]


def test_words_sharing_a_span_align_to_the_same_tokens(tmp_path):
    """Two words of one multiword token overlap the same tokens; alignment accepts that."""
    from headscope.data.align import token_word_maps

    (sentence,) = read_conllu(write(tmp_path, SPANISH)).sentences
    spans = [(w.start, w.end) for w in sentence.words]
    # One token per whitespace-separated piece, as a tokenizer without subwords would cut it.
    offsets = [(0, 5), (6, 9), (10, 17), (17, 18), (19, 25), (25, 26)]
    to_word, from_word = token_word_maps(offsets, [False] * len(offsets), spans, len(sentence.text))
    assert to_word[1].tolist() == [0, 0.5, 0.5, 0, 0, 0, 0, 0, 0]  # "del" splits its mass between de, el
    assert torch.equal(from_word[:, 1], from_word[:, 2]) and from_word[1, 1] == 1.0
    assert to_word[4, 5:8].tolist() == pytest.approx([1 / 3] * 3)
    assert torch.allclose(to_word.sum(1), torch.ones(len(offsets)))


def test_text_line_with_odd_whitespace_is_kept(tmp_path):
    data = GOOD.replace("# text = I don't like cats.", "# text = I  don't\u00a0like cats.")
    first = read_conllu(write(tmp_path, data)).sentences[0]
    assert first.text == "I  don't\u00a0like cats."
    assert [first.text[w.start : w.end] for w in first.words] == ["I", "do", "n't", "like", "cats", "."]


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        # "# text" spells the words, not the surface token: the forms disagree with the text.
        ("# text = Vengo del mercado", "# text = Vengo de el mercado", r"t\.conllu:4: FORM 'del' disagrees"),
        ("# text = Vengo del mercado", "# text = Vengo al mercado", r"t\.conllu:4: FORM 'del' disagrees"),
        ("dámelo.", "dámelo. ¡Ya!", r"t\.conllu:2: '# text' continues with '¡Ya!'"),
        ("4\tmercado\tmercado", "4\tmercados\tmercado", r"t\.conllu:7: FORM 'mercados' disagrees"),
    ],
)
def test_text_line_that_disagrees_with_the_forms(tmp_path, old, new, message):
    data = SPANISH.replace(old, new)
    assert data != SPANISH
    with pytest.raises(TreebankError, match=message):
        read_conllu(write(tmp_path, data))
    treebank = read_conllu(write(tmp_path, data + "\n" + GOOD), skip_bad=True)
    assert len(treebank.sentences) == 2 and len(treebank.skipped) == 1
    assert "disagrees" in treebank.skipped[0] or "continues" in treebank.skipped[0]


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
        (
            "1-3\tIt's\t_\t_\t_\t_\t_\t_\t_\t_\n" + "1\tIt\tit\tPRON\t_\t_\t0\troot\t_\t_\n",
            r"range 1-3 does not cover",
        ),
        (
            "1-2\tab\t_\t_\t_\t_\t_\t_\t_\t_\n2-3\tbc\t_\t_\t_\t_\t_\t_\t_\t_\n"
            + "".join(
                f"{i}\t{c}\t_\t_\t_\t_\t{0 if i == 1 else 1}\tdep\t_\t_\n" for i, c in enumerate("abc", 1)
            ),
            r"t\.conllu:2: multiword range overlaps",
        ),
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
    from headscope.data.prompts import builtin

    required = {"nsubj", "obj", "det", "amod", "advmod", "aux", "case", "mark"}
    for name in ("syntax/en.conllu", "syntax/zh.conllu"):
        treebank = read_conllu(builtin(name))
        assert len(treebank.sentences) >= 150
        found = {w.deprel for s in treebank.sentences for w in s.words}
        assert required <= found, (name, required - found)
