"""Layers point one way (../shared/DESIGN.md): the spine (in its notebooks' order) ← methods ← merge ← the tiny benchmark ←
the paper packages ← reproduce ← the docs; a paper package never imports another one, and no module imports itself back
through others. The edges that break this today are listed below, each with why it stands; the list may only shrink."""
import itertools
from fusion_nb.reproduce.fingerprints import import_graph

SPINE = ['core', 'algebra', 'checkpoints', 'catalog', 'pools', 'evaluation']   # nbs/00–06, in that order
LAYERS = {'methods': 1, 'merge': 2, 'tiny': 3, 'neulig': 4, 'robust': 4, 'masking': 4, 'llava': 4, 'reproduce': 5, 'docs': 6, 'site': 6}

ALLOWED = {   # (importer, imported): why it stands
    ('fusion_nb.merge', 'fusion_nb.neulig.neulig'): "the facade registers every declared method, paper 001's NeuLig included: "
                                                     "`from fusion_nb.merge import MERGE_METHODS` must list them all",
}
CYCLES = {}   # pairs of modules that reach each other (through imports inside functions too): none; keep it so

def modules():
    "The package's module graph without its package nodes (`fusion_nb.robust` is its modules' layer, already counted)."
    g = import_graph(); pkgs = {m for m in g if any(o.startswith(m + '.') for o in g)}
    return {a: {b for b in bs if b not in pkgs} for a, bs in g.items() if a not in pkgs}

def rank(m):
    top = m.split('.')[1]
    return (0, SPINE.index(top)) if top in SPINE else (LAYERS[top], 0)

def violations(graph):
    "Edges that import a higher layer, a later spine module, or another paper's package."
    out = set()
    for a, bs in graph.items():
        for b in bs:
            ta, tb = a.split('.')[1], b.split('.')[1]
            if ta == tb: continue   # inside one package: the cycle test below watches it
            if rank(b) > rank(a) or (rank(a) == rank(b) and ta != tb): out.add((a, b))
    return out

def test_every_module_has_a_layer():
    for m in modules(): rank(m)

def test_layers_point_one_way():
    found = violations(modules())
    assert found <= set(ALLOWED), sorted(found - set(ALLOWED))
    assert set(ALLOWED) <= found, f'no longer needed, remove from ALLOWED: {sorted(set(ALLOWED) - found)}'

def test_the_check_fails_on_an_upward_import():
    assert violations({'fusion_nb.core': {'fusion_nb.merge'}, 'fusion_nb.robust.zoo': {'fusion_nb.llava.model'},
                       'fusion_nb.pools': {'fusion_nb.core'}}) == {('fusion_nb.core', 'fusion_nb.merge'),
                                                                   ('fusion_nb.robust.zoo', 'fusion_nb.llava.model')}

def test_no_module_imports_itself_back():
    g = modules()
    def reaches(a, b, seen=()):
        return b in g.get(a, ()) or any(reaches(c, b, seen + (a,)) for c in g.get(a, ()) if c not in seen and c != a)
    cycles = {tuple(sorted((a, b))) for a, bs in g.items() for b in bs if a != b and reaches(b, a)}
    assert cycles <= set(CYCLES), sorted(cycles - set(CYCLES))
    assert set(CYCLES) <= cycles, f'no longer a cycle, remove from CYCLES: {sorted(set(CYCLES) - cycles)}'
