"""The papers' numbers the sections quote: each family keeps its own (`analyses/<family>/paper.py`),
and the report's footer lists every source they use, once, in the registry's order."""
from __future__ import annotations

import html
import importlib
import pkgutil

import bertscope.analyses as analyses
from bertscope.analyses import registry
from bertscope.report.quotes import Number, Source
from bertscope.report.writer import paper_sources, render


def paper_modules():
    names = [m.name for m in pkgutil.walk_packages(analyses.__path__, analyses.__name__ + ".")]
    return [importlib.import_module(n) for n in names if n.endswith(".paper")]


def numbers_in(value):
    """Every Number inside a paper module's value (dicts, tuples, lists nested)."""
    if isinstance(value, Number):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from numbers_in(v)
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from numbers_in(v)


def test_every_source_a_family_defines_is_in_the_footer_once():
    modules = paper_modules()
    # the walk finds every paper.py, and each is one the registry names (nothing defined and never listed)
    assert len(modules) >= 16
    assert {m.__name__ for m in modules} == {entry.split(":")[0] for entry in registry.PAPER_SOURCES}
    defined = {id(v) for m in modules for v in vars(m).values() if isinstance(v, Source)}
    listed = [id(s) for s in paper_sources()]
    assert len(listed) == len(set(listed)) == len(registry.PAPER_SOURCES)
    assert set(listed) == defined


def test_every_quoted_number_names_a_listed_source():
    listed = {id(s) for s in paper_sources()}
    quoted = [n for m in paper_modules() for v in vars(m).values() for n in numbers_in(v)]
    assert len(quoted) > 50
    assert all(id(n.source) in listed for n in quoted), [n for n in quoted if id(n.source) not in listed]
    finetune = importlib.import_module("bertscope.analyses.finetune.paper")  # Numbers made on demand too
    rte = finetune.kovaleva_accuracy("rte")
    assert {k: n.value for k, n in rte.items()} == {"pretrained_no_ft": 52.7, "random_ft": 52.7,
                                                    "pretrained_ft": 64.6}
    assert id(rte["pretrained_ft"].source) in listed
    assert finetune.kovaleva_accuracy("arct") is None


def test_the_footer_lists_the_sources_in_the_registry_order(tmp_path):
    page = render(tmp_path, [])
    footer = page[page.index("<footer>"):]
    items = [html.unescape(li.split("</li>")[0]) for li in footer.split("<li>")[1:]]
    assert items == [str(s) for s in paper_sources()]
    assert items[0] == ("Clark et al. (2019) section 3 (text): bert-base-uncased on 1,000 Wikipedia segments of "
                        "128 tokens")
    michel = items.index("Michel et al. (2019) section 3 (ablating one head; all heads but one): bert-base-uncased "
                         "on MultiNLI, fine-tuned")
    # the 2019 papers first, then the decoders' in the order their commands were added
    assert [item.split(" (")[0] for item in items[michel + 1:]] == [
        "Xiao et al.", "Gu et al.", "Sun et al.", "Olsson et al.", "Liu et al.", "Hsieh et al.", "Wu et al.",
        "Xiao et al.", "Xiao et al.", "Voita et al."]  # DuoAttention's README (heads streaming), its paper (atlas)
