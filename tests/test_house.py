"""The house rules that keep the project easy to change (issue 23): each default written once, and notebooks whose exported
cells hold one definition each, short enough to read beside their example. `tests/test_layers.py` checks the layers."""
import inspect, json, re, statistics
from pathlib import Path

import pytest
from fusion_nb.merge import MERGE_METHODS
from fusion_nb.methods.registry import NO_DEFAULT, Hyper, MergeMethod

REPO = Path(__file__).resolve().parents[1]

def methods():
    "Every declared method once (aliases share their declaration)."
    return list({id(m): m for m in (MERGE_METHODS[n] for n in MERGE_METHODS.names())}.values())

def exported_cell_sizes(nbs:Path=REPO/'nbs')->list[int]:
    "Lines of code (directives left out) of every exported cell of the project's notebooks."
    out = []
    for p in sorted(nbs.rglob('*.ipynb')):
        for c in json.loads(p.read_text())['cells']:
            lines = ''.join(c['source']).splitlines() if c['cell_type'] == 'code' else []
            if lines and re.match(r'#\|\s*exports?\b', lines[0]): out.append(sum(not l.startswith('#|') for l in lines))
    return out

@pytest.mark.parametrize('m', methods(), ids=lambda m: m.name)
def test_each_default_is_written_once(m):
    "The default and meaning of a hyperparameter are its rule's or fuse's signature's; the Hyper adds source, type and range."
    fn = m.rule or m.fuse
    ps = inspect.signature(fn).parameters
    assert 'hp' not in ps, f"{m.name}: declared the old way (defaults in Hypers, a rule reading hp[...])"
    assert all(h.default is not NO_DEFAULT for h in m.hypers.values())
    assert m.defaults() == {k: ps[k].default for k in m.hypers}, f"{m.name}: defaults other than its signature's"
    for paper, settings in m.papers.items():   # a paper's rows that run a default say nothing about it
        same = [k for k, v in settings.items() if type(v) is type(m.hypers[k].default) and v == m.hypers[k].default]
        assert not same, f"{m.name}: papers[{paper!r}] restates the default of {same}"

def test_a_default_written_twice_is_refused():
    rule = lambda pretrained, experts, w=0.5: None
    with pytest.raises(ValueError, match='written twice'):
        MergeMethod('twice', 'Twice', '', 'training-free', hypers={'w': Hyper(default=0.5, source='made up')}, rule=rule)
    with pytest.raises(ValueError, match='other than its Hypers declare'):
        MergeMethod('missing', 'Missing', '', 'training-free', hypers={}, rule=rule)

def test_exported_cells_are_short():
    "One definition per exported cell (median at most 12 lines, 90 % at most 25), as nbdev's own notebooks (9.5 / 24)."
    sizes = sorted(exported_cell_sizes())
    median, p90 = statistics.median(sizes), sizes[int(0.9 * len(sizes))]
    assert median <= 12 and p90 <= 25, f"exported cells: median {median}, p90 {p90} lines ({len(sizes)} cells)"

def test_the_size_check_counts_what_it_should(tmp_path):
    nb = {'cells': [{'cell_type': 'code', 'source': ['#| export\n', 'a = 1\n', 'b = 2']},
                    {'cell_type': 'code', 'source': ['test_eq(a, 1)']},
                    {'cell_type': 'markdown', 'source': ['#| export\n', 'prose']},
                    {'cell_type': 'code', 'source': ['#| exports\n', '#| hide\n', 'def f(): pass']}]}
    (tmp_path/'x.ipynb').write_text(json.dumps(nb))
    assert exported_cell_sizes(tmp_path) == [2, 1]

# where the package may name transformers' image processors, and why (everywhere else: fusion_nb.pools' two functions)
PROCESSORS_NAMED = {'pools.py': "load_image_processor and clip_image_processor: PIL's backend on every machine",
                    'reproduce/export.py': "copies the base model's processor files into an export (computes no pixels)"}

def test_image_processors_come_from_pools():
    "Pixels are PIL's on every machine (torchvision's differ by up to 2.4e-7, and a zoo trained on them has other weights)."
    found = []
    for f in sorted((REPO/'fusion_nb').rglob('*.py')):
        rel = f.relative_to(REPO/'fusion_nb').as_posix()
        if rel in PROCESSORS_NAMED or rel == '_modidx.py': continue
        found += [f'{rel}:{i}: {l.strip()}' for i, l in enumerate(f.read_text(encoding='utf-8').splitlines(), 1)
                  if re.search(r'\b(AutoImageProcessor|CLIPImageProcessor\w*)\b', l)]
    assert not found, 'make image processors with fusion_nb.pools.load_image_processor / clip_image_processor:\n' + '\n'.join(found)
