"""Layers point one way (../shared/DESIGN.md): the spine (in its notebooks' order) ← methods ← merge ← the tiny benchmark ←
the paper packages ← reproduce ← the docs; a paper package never imports another one, and no module imports itself back
through others. The edges that break this today are listed below, each with why it stands; the list may only shrink."""
import itertools
from fusion_nb.reproduce.runner import import_graph

SPINE = ['core', 'algebra', 'checkpoints', 'catalog', 'pools', 'evaluation']   # nbs/00–06, in that order
LAYERS = {'methods': 1, 'merge': 2, 'tiny': 3, 'neulig': 4, 'robust': 4, 'masking': 4, 'llava': 4, 'reproduce': 5, 'docs': 6, 'site': 6}

ALLOWED = {   # (importer, imported): why it stands until the house issue moves it
    ('fusion_nb.merge', 'fusion_nb.neulig.neulig'): "paper 001's method is declared in its paper's package and registered by the facade",
    ('fusion_nb.reproduce.rows', 'fusion_nb.merge'): 'paper rows belong in reproduce (issue 23: move them)',
    ('fusion_nb.reproduce.rows', 'fusion_nb.reproduce.reports'): 'paper rows read the paper values (issue 23: move rows to reproduce)',
    ('fusion_nb.neulig.merge_vs_ensemble', 'fusion_nb.merge'): "paper 001's Mer./Ens./Gap runs every method by name",
    ('fusion_nb.neulig.merge_vs_ensemble', 'fusion_nb.reproduce.reports'): 'its table labels (issue 23: labels into the spine)',
    ('fusion_nb.reproduce.sota', 'fusion_nb.merge'): "the beyond-paper-000 rows run every method by name (like reproduce.rows)",
    ('fusion_nb.llava.benchmarks', 'fusion_nb.reproduce.profiles'): 'hub helpers (issue 23: move them into checkpoints)',
    ('fusion_nb.masking.imagenet_data', 'fusion_nb.reproduce.profiles'): 'hub helpers (issue 23: move them into checkpoints)',
    ('fusion_nb.robust.paper_data', 'fusion_nb.masking.imagenet_data'): 'ImageNet sources shared by papers 002 and 003 (issue 23: into the spine)',
    ('fusion_nb.robust.paper_data', 'fusion_nb.masking.counterfactual_ft'): 'class grouping shared by papers 002 and 003 (issue 23: into the spine)',
    ('fusion_nb.llava.uq_merge', 'fusion_nb.reproduce.hf_merge'): "merge_llava writes through the streaming writer (issue 23: writer into checkpoints)",
    ('fusion_nb.neulig.second_backbone', 'fusion_nb.reproduce.profiles'): "Table s6's backbone reads a profile (issue 23: into paper 001's package)",
}
CYCLES = {   # pairs of modules that reach each other (mostly through imports inside functions); the list may only shrink
    ('fusion_nb.reproduce.merge_config', 'fusion_nb.reproduce.runner'): 'fingerprints (issue 23: their own module, the CLI into reproduce/cli)',
    ('fusion_nb.reproduce.profiles', 'fusion_nb.reproduce.runner'): "profile_sources asks the runner for a profile's experiments",
    ('fusion_nb.reproduce.export', 'fusion_nb.reproduce.hf_merge'): 'the writer and the model card live in each other',
    ('fusion_nb.reproduce.export', 'fusion_nb.reproduce.merge_config'): 'merge configs export; export reads their names',
    ('fusion_nb.reproduce.export', 'fusion_nb.reproduce.profiles'): 'through merge_config',
    ('fusion_nb.reproduce.hf_merge', 'fusion_nb.reproduce.merge_config'): 'the two schemas call each other',
    ('fusion_nb.reproduce.merge_config', 'fusion_nb.reproduce.profiles'): 'through the runner',
    ('fusion_nb.reproduce.profiles', 'fusion_nb.robust.paper_data'): "the offline check lists paper 002's sources",
    ('fusion_nb.masking.imagenet_data', 'fusion_nb.reproduce.profiles'): 'hub helpers and the offline check (issue 23)',
    ('fusion_nb.masking.imagenet_data', 'fusion_nb.robust.paper_data'): 'through profiles',
    ('fusion_nb.llava.benchmarks', 'fusion_nb.reproduce.profiles'): 'hub helpers and the offline check (issue 23)',
    ('fusion_nb.reproduce.profiles', 'fusion_nb.neulig.second_backbone'): "Table s6's backbone (issue 23: into paper 001's package)",
    ('fusion_nb.reproduce.runner', 'fusion_nb.neulig.second_backbone'): "Table s6's backbone (issue 23: into paper 001's package)",
}

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
