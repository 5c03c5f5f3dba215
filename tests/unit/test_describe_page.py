"""describe's page and card: the report's shell painted from each head's card (colour, tooltip,
filters), and the card that draws the head (two heatmaps of one excerpt), inline in a notebook."""

from __future__ import annotations

import base64
import re
import struct
import zlib

import numpy as np
import pytest

from headscope.analyses.describe.atlas import excerpt_maps
from headscope.analyses.describe.present import KIND_COLORS, cell_color, ink
from headscope.errors import InputError


@pytest.fixture(scope="module")
def described(toy, toy_texts):
    import headscope as hs

    return hs.describe(toy, eval_text=toy_texts, context=96, windows=4, resamples=0)


def _png(uri: str) -> tuple[int, int, np.ndarray]:
    """(width, height, grey levels) of a greyscale PNG data URI (one IDAT, filter 0 rows)."""
    data = base64.b64decode(uri.split(",", 1)[1])
    width, height = struct.unpack(">II", data[16:24])
    at, idat = 8, b""
    while at < len(data):
        (size,) = struct.unpack(">I", data[at : at + 4])
        if data[at + 4 : at + 8] == b"IDAT":
            idat += data[at + 8 : at + 8 + size]
        at += 12 + size
    raw = np.frombuffer(zlib.decompress(idat), dtype=np.uint8).reshape(height, width + 1)
    assert (raw[:, 0] == 0).all()
    return width, height, raw[:, 1:]


def test_the_card_draws_the_heads_two_maps_on_the_same_cells(described):
    card = described.card("L1H2")
    page = card._repr_html_()
    assert "<script" not in page  # a notebook shows it without running anything
    figures = re.findall(r"<figure class=hm-fig data-map='(\w+)' data-rows='(\d+)' data-cols='(\d+)'", page)
    assert [f[0] for f in figures] == ["actual", "predicted"]
    assert figures[0][1:] == figures[1][1:]
    images = re.findall(r"src='(data:image/png;base64,[^']+)'", page)
    assert len(images) == 2
    maps = card.maps
    n = len(maps["tokens"]) - 1
    for uri, name in zip(images, ("actual", "predicted"), strict=True):
        width, height, pixels = _png(uri)
        assert (width, height) == (n + 1, n)
        # Each pixel is the map's value on one scale for both maps: white 0, black 1.
        np.testing.assert_array_equal(pixels, ink(maps[name]))
    assert ink(np.array([0.0, 1.0])).tolist() == [255, 0]
    assert np.all(np.diff(ink(np.linspace(0, 1, 256)).astype(int)) <= 0)  # darker with more attention
    # Token labels on both axes, each query's explained share beside its row.
    assert page.count("<div class=hm-x>") == 2 and page.count("<div class=hm-y>") == 2
    shares = re.search(r"<div class=hm-share[^>]*>(.*?)</div>", page).group(1)
    assert re.findall(r"<span>([\d.]+)</span>", shares) == [f"{v:.2f}" for v in maps["explained"]]
    assert "L1H2" in repr(card) and "explained" in repr(card)


def test_a_head_is_named_as_in_the_page(described):
    with pytest.raises(InputError, match="L<layer>H<head>"):
        described.card("1,2")
    with pytest.raises(InputError, match="outside the model's 2 layers x 4 heads"):
        described.card("L2H0")


def test_the_grid_is_painted_from_each_heads_card(described):
    atlas = described.atlas
    page = described.html(examples=False)
    assert "https:" not in page and "http:" not in page and "<link" not in page
    assert 'id="head-cards" hidden' in page and 'data-paint="kind"' in page
    templates = re.findall(r'<template data-head-card="(\d+),(\d+)"([^>]*)>', page)
    assert len(templates) == 2 * 4
    for layer, head, attributes in templates:
        entry = atlas.head(int(layer), int(head))
        fields = dict(re.findall(r'data-(\w+)="([^"]*)"', attributes))
        assert fields["kind"] == entry["dominant_kind"]
        assert fields["color"] == cell_color(entry["dominant_kind"], entry["explained"]["value"])
        assert float(fields["share"]) == pytest.approx(entry["explained"]["value"], abs=1e-4)
        assert fields["line"].startswith(f"L{layer}H{head} · ")
    # Summary plots instead of the counts table.
    for plot in ("plot-kinds", "plot-histogram", "plot-layers"):
        assert f"data-testid={plot}" in page
    # Every card has its maps.
    assert all(excerpt_maps(atlas.excerpts, h) is not None for h in atlas.heads)


def test_lightness_is_the_explained_share():
    full, faint = cell_color("token", 1.0), cell_color("token", 0.0)
    assert full == KIND_COLORS["token"]
    assert sum(int(faint[i : i + 2], 16) for i in (1, 3, 5)) > sum(
        int(full[i : i + 2], 16) for i in (1, 3, 5)
    )


def test_nearest_heads_of_an_atlas_and_itself_are_at_distance_zero(described):
    from headscope.analyses.describe.atlas import description_distance, nearest_heads

    atlas = described.atlas
    nearest = nearest_heads(atlas, atlas)
    assert set(nearest) == {(h["layer"], h["head"]) for h in atlas.heads}
    for (layer, _head), (other, distance) in nearest.items():
        assert distance == 0.0
        # Among equal descriptions, the one at the nearest relative depth: here its own layer.
        assert other["layer"] == layer
    a, b = atlas.heads[0], atlas.heads[-1]
    share = {"content-word": 1.0}
    assert description_distance(a, b, share, share) == pytest.approx(description_distance(b, a, share, share))
    assert 0 <= description_distance(a, b, share, share) <= 1


def test_report_draws_two_describe_results_side_by_side(described, tmp_path):
    from typer.testing import CliRunner

    from headscope.cli import app

    saved = tmp_path / "toy.json"
    saved.write_text(described.to_json())
    page = tmp_path / "two.html"
    runner = CliRunner()
    result = runner.invoke(app, ["report", str(saved), str(saved), "--html", str(page)])
    assert result.exit_code == 0, result.output
    text = page.read_text(encoding="utf-8")
    assert "data-testid=beside" in text  # both grids by relative depth
    partners = re.findall(r"data-partner='(L\d+H\d+)' data-distance='([\d.]+)'", text)
    assert len(partners) == 2 * 4 and all(float(d) == 0.0 for _, d in partners)
    # Each partner card is held once and named by the panel's placeholder.
    for name in {p for p, _ in partners}:
        assert text.count(f'<template data-labels="b:{name}">') == 1
        assert f"<a href='#b-{name}'><b>{name}</b></a>" in text  # the partner opens its own panel
    # Both grids of the side-by-side picture are cells that open a head: the first model's, its
    # panel; the second's, a panel of its own (its card beside a link to the first's closest head).
    heads = [(h["layer"], h["head"]) for h in described.atlas.heads]
    for side in ("a", "b"):
        drawn = re.findall(
            rf"data-side={side} data-layer='(\d+)' data-head='(\d+)' tabindex=0 role=button", text
        )
        assert sorted((int(a), int(b)) for a, b in drawn) == sorted(heads)
    for layer, head in heads:
        name = f"L{layer}H{head}"
        assert text.count(f'<template data-labels="b:{name}">') == 1
        own = re.search(
            rf'<template data-beside-card="{layer},{head}" data-model="[^"]+">(.*?)</template>', text
        )
        assert own is not None and f"<div data-labels='b:{name}'></div>" in own.group(1)
        # The same atlas on both sides: each head's closest is itself (distance 0, same layer).
        nearest = re.search(r"data-nearest='(L\d+H\d+)' data-distance='([\d.]+)'", own.group(1))
        assert nearest is not None and float(nearest.group(2)) == 0.0
        assert nearest.group(1).startswith(f"L{layer}H") and f"<a href='#{nearest.group(1)}'>" in own.group(1)
    three = runner.invoke(
        app, ["report", str(saved), str(saved), str(saved), "--html", str(tmp_path / "x.html")]
    )
    assert three.exit_code == 2 and "3 results given" in three.output
