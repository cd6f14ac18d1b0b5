"""The checkout's pinned builds (`pins/`): intact, current for the benchmark's recipes, and what a build from them gives."""
import hashlib, json, os, shutil
from pathlib import Path
import pytest

from fusion_nb.core import file_hashes, read_pins
from fusion_nb.tiny.build import BUILD_THREADS, benchmark_dir, build_benchmark, read_manifest, recipes

REPO = Path(__file__).resolve().parents[1]
PINS = REPO/'pins'
REPIN = "run `make pins` (FUSION_NB_PIN=1 builds keep what they make) and commit pins/ with the change"

def sha256(f:Path)->str: return hashlib.sha256(f.read_bytes()).hexdigest()

def test_every_pinned_file_is_there_with_its_bytes():
    index = read_pins(PINS)
    assert index, 'pins/index.json is missing or empty'
    kept_items = {item: e for item, e in index.items() if not e.get('hashes_only')}   # hashes-only: what builds render here
    for item, entry in kept_items.items():
        folder = PINS/item.rsplit('/', 1)[0]
        for rel, h in entry['files'].items():
            assert (folder/rel).is_file() and sha256(folder/rel) == h, f'{item}: pins/{folder.relative_to(PINS)}/{rel} is not the pinned file'
    kept = {f.relative_to(PINS).as_posix() for f in PINS.rglob('*') if f.is_file()} - {'index.json'}
    listed = {f"{item.rsplit('/', 1)[0]}/{rel}" for item, e in kept_items.items() for rel in e['files']}
    assert kept <= listed, f'files in pins/ no entry lists (left by an older recipe?): {sorted(kept - listed)[:5]}'

@pytest.mark.parametrize('scale', ['tiny', 'micro'])
def test_the_benchmark_zoo_is_pinned_at_its_recipe(scale):
    pins, rec = read_pins(PINS), recipes(scale, threads=BUILD_THREADS)
    assert pins.get(f'{scale}/models', {}).get('recipe') == rec['zoo'], f'the {scale} zoo recipe changed since it was pinned: {REPIN}'
    assert pins.get(f'{scale}/datasets', {}).get('recipe') == f"{rec['data']}+{rec['corruptions']}", \
        f'the {scale} datasets recipe changed since their hashes were pinned: {REPIN}'

def test_a_build_from_pins_trains_nothing_and_gives_the_pinned_bytes(tmp_path, monkeypatch):
    shutil.copy(REPO/'settings.ini', tmp_path/'settings.ini')
    monkeypatch.setenv('FUSION_NB_PINS', str(PINS))   # a scratch project reads the checkout's store only when told to
    notes = []
    base = build_benchmark('micro', tmp_path, progress=False, log=notes.append)
    # the datasets are rendered here, and must be the bytes the developers' build rendered (their hashes are pinned)
    assert not [n for n in notes if 'differ from the pinned build' in n], notes
    assert read_pins(PINS)['micro/datasets']['hashes_only']
    m = read_manifest('micro', tmp_path)
    assert m['rebuilt_now']['models'] == [] and m['rebuilt_now']['models_from_pins'] and 'pretrain_s' not in m['timings']
    pinned = read_pins(PINS)['micro/models']['files']
    assert {f: h for f, h in m['files'].items() if f.startswith('models/')} == pinned
    assert {f: h for f, h in file_hashes(base).items() if f.startswith('models/')} == pinned   # the bytes on disk, hashed again
    assert {f: h for f, h in m['files'].items() if f.startswith('datasets/')} == read_pins(PINS)['micro/datasets']['files']
