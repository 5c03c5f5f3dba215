"""Generate headscope's annotated diagnostic sets in configs/ (deterministic, seeded).

    python scripts/make_diagnostic_sets.py

Writes
* configs/syntax/en.conllu, configs/syntax/zh.conllu: template sentences with gold UD arcs for
  nsubj, obj, det, amod, advmod, aux, case, mark (plus obl, advcl, clf, punct, root);
* configs/coref/en.yaml, configs/coref/zh.yaml: pronoun/demonstrative → antecedent examples where
  agreement (gender, number, Chinese classifier) decides between two or three candidates, and
  the antecedent is often *not* the nearest candidate.

The sentences are built from small grammars, so every arc and span is exact by construction.
Chinese follows UD Chinese (GSD) conventions: classifiers are `clf` dependents of their noun,
aspect 了 and modal verbs are `aux`, 在 is `case`, 因为/如果 are `mark`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
N_SENTENCES = 180
N_COREF = 180


@dataclass
class Tok:
    form: str
    upos: str
    head: Tok | None = None
    rel: str = "root"


@dataclass
class Sent:
    toks: list[Tok] = field(default_factory=list)

    def add(self, form: str, upos: str) -> Tok:
        tok = Tok(form, upos)
        self.toks.append(tok)
        return tok

    def conllu(self, sent_id: str, spaced: bool) -> str:
        index = {id(t): i + 1 for i, t in enumerate(self.toks)}
        roots = [t for t in self.toks if t.head is None]
        assert len(roots) == 1, [t.form for t in roots]
        lines, text = [], []
        for i, tok in enumerate(self.toks):
            last = i == len(self.toks) - 1
            nxt = self.toks[i + 1] if not last else None
            space = spaced and not last and not (nxt is not None and nxt.upos == "PUNCT")
            text.append(tok.form + (" " if space else ""))
            head = index[id(tok.head)] if tok.head is not None else 0
            misc = "_" if space or last else "SpaceAfter=No"
            lines.append(f"{i + 1}\t{tok.form}\t{tok.form}\t{tok.upos}\t_\t_\t{head}\t{tok.rel}\t_\t{misc}")
        return f"# sent_id = {sent_id}\n# text = {''.join(text)}\n" + "\n".join(lines) + "\n"


def attach(dep: Tok, head: Tok, rel: str) -> None:
    dep.head, dep.rel = head, rel


# --- English -----------------------------------------------------------------------------------

EN_AGENTS = [
    "teacher",
    "farmer",
    "doctor",
    "child",
    "student",
    "pilot",
    "artist",
    "neighbor",
    "baker",
    "nurse",
    "driver",
    "singer",
    "engineer",
    "captain",
    "waiter",
    "writer",
]
EN_THINGS = [
    "letter",
    "door",
    "book",
    "window",
    "picture",
    "apple",
    "car",
    "song",
    "bridge",
    "map",
    "box",
    "umbrella",
    "key",
    "painting",
    "ticket",
    "basket",
]
EN_PLACES = ["garden", "river", "table", "station", "park", "kitchen", "market", "library", "hill", "office"]
EN_ADJ = ["old", "young", "tall", "quiet", "busy", "small", "heavy", "red", "new", "bright", "tired", "empty"]
EN_ADV = ["quickly", "carefully", "often", "rarely", "slowly", "quietly", "finally", "suddenly"]
EN_AUX = ["will", "can", "should", "must", "might", "could", "would", "may"]
EN_VERBS = [
    ("opened", "open"),
    ("painted", "paint"),
    ("carried", "carry"),
    ("found", "find"),
    ("cleaned", "clean"),
    ("watched", "watch"),
    ("fixed", "fix"),
    ("wrote", "write"),
    ("bought", "buy"),
    ("moved", "move"),
    ("dropped", "drop"),
    ("sold", "sell"),
    ("borrowed", "borrow"),
    ("hid", "hide"),
    ("lost", "lose"),
    ("checked", "check"),
]
EN_PREP = ["in", "near", "on", "at", "behind", "beside"]
EN_MARK = ["because", "when", "after", "although", "before", "while", "if"]
EN_DET = ["the", "a", "this", "that", "every"]


def en_np(s: Sent, rng: random.Random, nouns: list[str], adj_p: float = 0.5) -> Tok:
    det_form = rng.choice(EN_DET)
    n_adj = (2 if rng.random() < 0.3 else 1) if rng.random() < adj_p else 0
    adj_forms = rng.sample(EN_ADJ, n_adj)
    noun_form = rng.choice(nouns)
    following = adj_forms[0] if adj_forms else noun_form
    if det_form == "a" and following[0] in "aeiou":
        det_form = "an"
    det = s.add(det_form, "DET")
    adjs = [s.add(form, "ADJ") for form in adj_forms]
    noun = s.add(noun_form, "NOUN")
    attach(det, noun, "det")
    for adj in adjs:
        attach(adj, noun, "amod")
    return noun


def en_clause(s: Sent, rng: random.Random, allow_aux: bool = True) -> Tok:
    # The adverb goes before the verb, or after the object, so its distance to the verb varies.
    adv_place = rng.choice(["none", "none", "before", "before", "end"])
    subj = en_np(s, rng, EN_AGENTS)
    aux = s.add(rng.choice(EN_AUX), "AUX") if allow_aux and rng.random() < 0.45 else None
    adv = s.add(rng.choice(EN_ADV), "ADV") if adv_place == "before" else None
    past, base = rng.choice(EN_VERBS)
    verb = s.add(base if aux else past, "VERB")
    attach(subj, verb, "nsubj")
    if aux:
        attach(aux, verb, "aux")
    obj = en_np(s, rng, EN_THINGS)
    attach(obj, verb, "obj")
    if adv_place == "end":
        adv = s.add(rng.choice(EN_ADV), "ADV")
    if adv:
        attach(adv, verb, "advmod")
    return verb


def english_sentence(rng: random.Random) -> Sent:
    s = Sent()
    kind = rng.random()
    if kind < 0.35 and True:
        mark_first = rng.random() < 0.3
        if mark_first:
            mark = s.add(rng.choice(EN_MARK).capitalize(), "SCONJ")
            sub = en_clause(s, rng, allow_aux=False)
            s.add(",", "PUNCT").head = None
            comma = s.toks[-1]
            main = en_clause(s, rng)
            attach(comma, sub, "punct")
        else:
            main = en_clause(s, rng)
            mark = s.add(rng.choice(EN_MARK), "SCONJ")
            sub = en_clause(s, rng, allow_aux=False)
        attach(mark, sub, "mark")
        attach(sub, main, "advcl")
    else:
        main = en_clause(s, rng)
        if rng.random() < 0.6:
            prep = s.add(rng.choice(EN_PREP), "ADP")
            place = en_np(s, rng, EN_PLACES, adj_p=0.3)
            attach(prep, place, "case")
            attach(place, main, "obl")
    attach(s.add(".", "PUNCT"), main, "punct")
    main.head, main.rel = None, "root"
    first = s.toks[0]
    first.form = first.form[0].upper() + first.form[1:]
    return s


# --- Chinese -----------------------------------------------------------------------------------

ZH_NAMES = ["小明", "小红", "小刚", "小丽", "张伟", "王芳", "李雷", "韩梅梅", "老王", "小雪"]
ZH_PEOPLE = [
    ("老师", "位"),
    ("医生", "位"),
    ("学生", "个"),
    ("司机", "位"),
    ("农民", "个"),
    ("孩子", "个"),
    ("画家", "位"),
    ("邻居", "个"),
    ("工程师", "位"),
    ("厨师", "位"),
]
ZH_PERSON_ADJ = ["年轻", "老"]
ZH_VERBS = [
    ("看", [("书", "本"), ("报纸", "份"), ("电影", "部")]),
    ("买", [("苹果", "个"), ("书", "本"), ("自行车", "辆"), ("衣服", "件")]),
    ("画", [("画", "幅"), ("地图", "张")]),
    ("修", [("自行车", "辆"), ("电脑", "台"), ("椅子", "把")]),
    ("写", [("信", "封"), ("小说", "本")]),
    ("打开", [("门", "扇"), ("窗户", "扇"), ("盒子", "个")]),
    ("洗", [("衣服", "件"), ("杯子", "个")]),
    ("找到", [("钥匙", "把"), ("地图", "张")]),
    ("卖", [("房子", "套"), ("自行车", "辆")]),
    ("借", [("书", "本"), ("雨伞", "把")]),
]
ZH_ADJ = ["新", "旧", "大", "小", "红", "漂亮"]
ZH_ADV = ["已经", "常常", "也", "又", "终于", "马上"]  # before a modal: 也会, 马上要
ZH_MANNER_ADV = ["慢慢", "认真", "仔细"]  # after a modal: 会认真地…
ZH_AUX = ["会", "能", "要", "可以", "应该", "愿意"]
ZH_PLACES = ["学校", "公园", "家", "图书馆", "商店", "办公室", "教室", "医院"]
ZH_DET = ["这", "那"]


def zh_subject(s: Sent, rng: random.Random) -> Tok:
    if rng.random() < 0.45:
        return s.add(rng.choice(ZH_NAMES), "PROPN")
    noun, clf = rng.choice(ZH_PEOPLE)
    det = s.add(rng.choice(ZH_DET), "DET")
    cl = s.add(clf, "NOUN")
    adj = s.add(rng.choice(ZH_PERSON_ADJ), "ADJ") if rng.random() < 0.3 else None
    head = s.add(noun, "NOUN")
    attach(det, head, "det")
    attach(cl, head, "clf")
    if adj:
        attach(adj, head, "amod")
    return head


def zh_object(s: Sent, rng: random.Random, options: list[tuple[str, str]]) -> Tok:
    noun, clf = rng.choice(options)
    det = s.add(rng.choice(ZH_DET), "DET") if rng.random() < 0.75 else None
    cl = s.add(clf, "NOUN") if det else None
    adj = s.add(rng.choice(ZH_ADJ), "ADJ") if rng.random() < 0.5 else None
    head = s.add(noun, "NOUN")
    if det and cl:
        attach(det, head, "det")
        attach(cl, head, "clf")
    if adj:
        attach(adj, head, "amod")
    return head


def zh_clause(s: Sent, rng: random.Random, allow_place: bool = True) -> Tok:
    subj = zh_subject(s, rng)
    adv = s.add(rng.choice(ZH_ADV), "ADV") if rng.random() < 0.35 else None
    aux = s.add(rng.choice(ZH_AUX), "AUX") if rng.random() < 0.35 else None
    manner = s.add(rng.choice(ZH_MANNER_ADV), "ADV") if rng.random() < 0.2 else None
    place = None
    if allow_place and rng.random() < 0.35:
        prep = s.add("在", "ADP")
        place = s.add(rng.choice(ZH_PLACES), "NOUN")
        attach(prep, place, "case")
    verb_form, objects = rng.choice(ZH_VERBS)
    verb = s.add(verb_form, "VERB")
    le = s.add("了", "AUX") if aux is None and rng.random() < 0.5 else None
    obj = zh_object(s, rng, objects)
    attach(subj, verb, "nsubj")
    attach(obj, verb, "obj")
    for dep, rel in ((adv, "advmod"), (aux, "aux"), (manner, "advmod"), (le, "aux"), (place, "obl")):
        if dep is not None:
            attach(dep, verb, rel)
    return verb


def chinese_sentence(rng: random.Random) -> Sent:
    s = Sent()
    kind = rng.random()
    if kind < 0.2:  # 如果 ……，…… (subordinate clause first)
        mark = s.add("如果", "SCONJ")
        sub = zh_clause(s, rng, allow_place=False)
        comma = s.add("，", "PUNCT")
        main = zh_clause(s, rng)
        attach(mark, sub, "mark")
        attach(comma, sub, "punct")
        attach(sub, main, "advcl")
    elif kind < 0.4:  # ……，因为 ……
        main = zh_clause(s, rng)
        comma = s.add("，", "PUNCT")
        mark = s.add("因为", "SCONJ")
        sub = zh_clause(s, rng, allow_place=False)
        attach(comma, main, "punct")
        attach(mark, sub, "mark")
        attach(sub, main, "advcl")
    else:
        main = zh_clause(s, rng)
    attach(s.add("。", "PUNCT"), main, "punct")
    main.head, main.rel = None, "root"
    return s


def write_treebank(path: Path, make, rng: random.Random, spaced: bool, prefix: str, header: str) -> int:
    seen, blocks = set(), []
    while len(blocks) < N_SENTENCES:
        sent = make(rng)
        key = " ".join(t.form for t in sent.toks)
        if key in seen:
            continue
        seen.add(key)
        blocks.append(sent.conllu(f"{prefix}-{len(blocks) + 1:03d}", spaced))
    path.write_text(header + "\n" + "\n".join(blocks), encoding="utf-8")
    return len(blocks)


# --- Coreference ------------------------------------------------------------------------------

EN_MEN = ["John", "David", "Michael", "Tom", "Peter", "James", "Daniel", "Robert"]
EN_WOMEN = ["Mary", "Anna", "Lisa", "Sarah", "Emma", "Kate", "Laura", "Alice"]
EN_MEETS = [
    "met {B} at the station",
    "called {B} last night",
    "visited {B} on Sunday",
    "waited for {B} outside the library",
    "wrote to {B} after the trip",
    "sat next to {B} at dinner",
]
EN_AFTER_SUBJ = [
    "{P} had forgotten the tickets",
    "{P} looked very tired",
    "{P} was carrying a heavy bag",
    "{P} wanted to talk about the plan",
    "{P} had just come back from Paris",
    "{P} was late again",
]
EN_OBJ_CLAUSE = [
    "nobody had told {P} about the delay",
    "the teacher thanked {P} for the help",
    "the guard stopped {P} at the gate",
    "everyone waited for {P} at the door",
]
EN_SG_PL = [
    ("painting", "photos"),
    ("lamp", "chairs"),
    ("letter", "postcards"),
    ("coat", "shoes"),
    ("cake", "cookies"),
    ("map", "books"),
    ("bicycle", "cars"),
    ("vase", "flowers"),
]
EN_SG_PL_END = [("was", "were"), ("looked", "looked"), ("had", "had")]
EN_SG_PL_PRED = ["{V} a gift from my grandfather", "{V} on the table all week", "{V} older than the house"]


def span_of(text: str, needle: str, start: int = 0) -> list[int]:
    i = text.index(needle, start)
    return [i, i + len(needle)]


def spans_in_order(text: str, needles: list[str]) -> list[list[int]]:
    """Spans of ``needles`` found one after another, left to right."""
    spans, start = [], 0
    for needle in needles:
        spans.append(span_of(text, needle, start))
        start = spans[-1][1]
    return spans


def english_coref(rng: random.Random, n: int) -> list[dict]:
    items: list[dict] = []
    seen = set()
    while len(items) < n:
        kind = rng.random()
        if kind < 0.55:  # gender decides between two names
            man, woman = rng.choice(EN_MEN), rng.choice(EN_WOMEN)
            first, second = (man, woman) if rng.random() < 0.5 else (woman, man)
            target = rng.choice([first, second])
            subject = "he" if target == man else "she"
            objective = "him" if target == man else "her"
            meet = rng.choice(EN_MEETS).format(B=second)
            if rng.random() < 0.6:
                rest = rng.choice(EN_AFTER_SUBJ).format(P=subject)
                text = f"{first} {meet}, and {rest}."
                pronoun = span_of(text, f" {subject} ")
                pronoun = [pronoun[0] + 1, pronoun[1] - 1]
            else:
                rest = rng.choice(EN_OBJ_CLAUSE).format(P=objective)
                text = f"{first} {meet}, but {rest}."
                start = text.index(f" {objective} ") + 1
                pronoun = [start, start + len(objective)]
            cands = [span_of(text, first), span_of(text, second, len(first))]
            antecedent = 0 if target == first else 1
        elif kind < 0.75:  # three names, only one of the pronoun's gender
            same = rng.sample(EN_MEN, 2) if rng.random() < 0.5 else rng.sample(EN_WOMEN, 2)
            other = rng.choice(EN_WOMEN if same[0] in EN_MEN else EN_MEN)
            pronoun_word = "she" if other in EN_WOMEN else "he"
            names = [other, *same]
            rng.shuffle(names)  # the one who matches the pronoun can stand anywhere
            text = f"{names[0]} told {names[1]} and {names[2]} that {pronoun_word} would bring the food."
            cands = spans_in_order(text, names)
            antecedent = names.index(other)
            pronoun = span_of(text, f" {pronoun_word} ")
            pronoun = [pronoun[0] + 1, pronoun[1] - 1]
        else:  # number decides: it / they
            sg, pl = rng.choice(EN_SG_PL)
            order = [sg, pl] if rng.random() < 0.5 else [pl, sg]
            target = rng.choice([sg, pl])
            verb_sg, verb_pl = rng.choice(EN_SG_PL_END)
            pron = "it" if target == sg else "they"
            verb = verb_sg if target == sg else verb_pl
            pred = rng.choice(EN_SG_PL_PRED).format(V=verb)
            text = f"I found the {order[0]} and the {order[1]} in the attic, and {pron} {pred}."
            cands = [span_of(text, f"the {order[0]}"), span_of(text, f"the {order[1]}")]
            cands = [[c[0] + 4, c[1]] for c in cands]
            antecedent = order.index(target)
            start = text.index(f", and {pron} ") + 6
            pronoun = [start, start + len(pron)]
        if text in seen:
            continue
        seen.add(text)
        assert text[pronoun[0] : pronoun[1]] in {"he", "she", "him", "her", "it", "they"}, text
        items.append(
            {
                "id": f"en-{len(items) + 1:03d}",
                "lang": "en",
                "text": text,
                "pronoun": pronoun,
                "candidates": cands,
                "antecedent": antecedent,
            }
        )
    return items


ZH_MEN = ["小明", "小刚", "小强", "大伟", "张伟", "李雷", "王磊", "刘洋"]
ZH_WOMEN = ["小红", "小丽", "小芳", "韩梅梅", "王芳", "小雪", "李娜", "陈静"]
ZH_MEETS = [
    "在车站遇到了{B}",
    "昨天给{B}打了电话",
    "星期天去看望了{B}",
    "在图书馆门口等{B}",
    "和{B}一起吃了晚饭",
]
ZH_AFTER = [
    "{P}忘了带票",
    "{P}看起来很累",
    "{P}拿着一个很重的包",
    "{P}想谈谈那个计划",
    "{P}刚从北京回来",
    "{P}又迟到了",
]
ZH_CLASSIFIED = [
    ("幅", "风景画"),
    ("张", "照片"),
    ("本", "小说"),
    ("辆", "自行车"),
    ("只", "小猫"),
    ("条", "裙子"),
    ("把", "椅子"),
    ("台", "电脑"),
    ("双", "鞋"),
    ("件", "外套"),
    ("棵", "树"),
    ("杯", "茶"),
]
ZH_PLACES_ON = ["桌上放着", "墙边摆着", "屋里有", "院子里有", "商店里卖"]
ZH_OWNERS = ["爷爷", "奶奶", "小明", "小红", "邻居", "老师"]


def chinese_coref(rng: random.Random, n: int) -> list[dict]:
    items: list[dict] = []
    seen = set()
    while len(items) < n:
        kind = rng.random()
        if kind < 0.5:  # 他 / 她 decides between two names
            man, woman = rng.choice(ZH_MEN), rng.choice(ZH_WOMEN)
            first, second = (man, woman) if rng.random() < 0.5 else (woman, man)
            target = rng.choice([first, second])
            pron = "他" if target == man else "她"
            text = f"{first}{rng.choice(ZH_MEETS).format(B=second)}，{rng.choice(ZH_AFTER).format(P=pron)}。"
            cands = [span_of(text, first), span_of(text, second, len(first))]
            antecedent = 0 if target == first else 1
            pronoun = span_of(text, pron, cands[1][1])
        elif kind < 0.65:  # three names, one of the pronoun's gender
            same = rng.sample(ZH_MEN, 2) if rng.random() < 0.5 else rng.sample(ZH_WOMEN, 2)
            other = rng.choice(ZH_WOMEN if same[0] in ZH_MEN else ZH_MEN)
            pron = "她" if other in ZH_WOMEN else "他"
            names = [other, *same]
            rng.shuffle(names)
            text = f"{names[0]}告诉{names[1]}和{names[2]}，{pron}明天会带午饭来。"
            cands = spans_in_order(text, names)
            antecedent = names.index(other)
            pronoun = span_of(text, pron, cands[2][1])
        else:  # 那 + classifier picks the noun it agrees with (那幅 = 风景画)
            (c1, n1), (c2, n2) = rng.sample(ZH_CLASSIFIED, 2)
            target = rng.choice([0, 1])
            clf = (c1, c2)[target]
            owner = rng.choice(ZH_OWNERS)
            text = f"{rng.choice(ZH_PLACES_ON)}一{c1}{n1}和一{c2}{n2}，那{clf}是{owner}的。"
            first_noun = span_of(text, f"一{c1}{n1}")
            cands = [[first_noun[0] + 1 + len(c1), first_noun[1]]]
            second_noun = span_of(text, f"一{c2}{n2}", first_noun[1])
            cands.append([second_noun[0] + 1 + len(c2), second_noun[1]])
            antecedent = target
            pronoun = span_of(text, f"那{clf}", cands[1][1])
        if text in seen:
            continue
        seen.add(text)
        items.append(
            {
                "id": f"zh-{len(items) + 1:03d}",
                "lang": "zh",
                "text": text,
                "pronoun": pronoun,
                "candidates": cands,
                "antecedent": antecedent,
            }
        )
    return items


def write_coref(path: Path, name: str, description: str, items: list[dict]) -> None:
    nearest_wrong = sum(
        1
        for it in items
        if max((c for c in it["candidates"] if c[1] <= it["pronoun"][0]), key=lambda c: c[1])
        != it["candidates"][it["antecedent"]]
    )
    body = yaml.safe_dump(
        {"name": name, "description": description, "items": items},
        allow_unicode=True,
        sort_keys=False,
        width=200,
        default_flow_style=None,
    )
    path.write_text(
        f"# Generated by scripts/make_diagnostic_sets.py; do not edit by hand.\n"
        f"# {len(items)} examples; the nearest preceding candidate is wrong in {nearest_wrong}.\n" + body,
        encoding="utf-8",
    )


def main() -> None:
    header = (
        "# Generated by scripts/make_diagnostic_sets.py; do not edit by hand.\n"
        "# Template sentences with gold Universal Dependencies arcs, written for headscope.\n"
    )
    n_en = write_treebank(
        ROOT / "configs/syntax/en.conllu", english_sentence, random.Random(11), True, "en", header
    )
    n_zh = write_treebank(
        ROOT / "configs/syntax/zh.conllu", chinese_sentence, random.Random(12), False, "zh", header
    )
    write_coref(
        ROOT / "configs/coref/en.yaml",
        "coref-en",
        "English pronouns resolved by gender or number agreement; two or three candidates.",
        english_coref(random.Random(21), N_COREF),
    )
    write_coref(
        ROOT / "configs/coref/zh.yaml",
        "coref-zh",
        "中文指代：他/她 由性别决定，那+量词 由量词搭配决定（那幅 = 风景画）。",
        chinese_coref(random.Random(22), N_COREF),
    )
    print(f"wrote {n_en} English and {n_zh} Chinese sentences, {N_COREF} + {N_COREF} coreference examples")


if __name__ == "__main__":
    main()
