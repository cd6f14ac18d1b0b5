"Evaluation throughput (one DataLoader per call, workers, autocast), its benchmark, and pinned hub revisions (issue 16)."
import json
from pathlib import Path

import pytest, torch

import fusion_nb.pools
from fusion_nb.core import FusionError, HyperparameterError
from fusion_nb.checkpoints import resolve_model_dir
from fusion_nb.evaluation import evaluate
from fusion_nb.pools import PRETRAINED, ModelPool, TaskPool, load_split
from fusion_nb.reproduce.profiles import load_profile, resolved_revisions
from fusion_nb.reproduce.runner import reproduce
from conftest import bench_module
from test_reproduce import SETTINGS, project   # the scratch project of the runner's tests


@pytest.fixture(scope='module')
def pools(micro_project):
    prof = load_profile('micro-test', settings=micro_project/'settings.ini')
    return ModelPool.from_profile(prof), TaskPool.from_profile(prof)

def test_predictions_do_not_depend_on_workers_or_batch_mates(pools):
    mp, tp = pools
    rows = {'pretrained': PRETRAINED, 'ensemble': ['shapes', 'colors']}
    a = evaluate(rows, mp, tp, batch_size=5, num_workers=0, progress=False)
    b = evaluate(rows, mp, tp, batch_size=3, num_workers=2, progress=False)   # other batch-mates, worker processes
    assert list(a[['model', 'task', 'metric']].itertuples(index=False)) == list(b[['model', 'task', 'metric']].itertuples(index=False))
    acc = a.metric == 'accuracy'
    assert a[acc].value.tolist() == b[acc].value.tolist()
    assert a[~acc].value.tolist() == pytest.approx(b[~acc].value.tolist(), rel=1e-5)
    one = evaluate({'x': 'colors'}, mp, tp, tasks=['colors'], batch_size=1, progress=False)   # one image at a time
    many = evaluate({'x': 'colors'}, mp, tp, tasks=['colors'], batch_size=64, progress=False)
    assert one.value.tolist() == pytest.approx(many.value.tolist(), rel=1e-5)

def test_an_empty_task_is_an_error_not_a_missing_row(pools, monkeypatch):
    "With one loader for all tasks, a task without a single batch must still fail loudly."
    mp, tp = pools
    task = tp['shapes']; load = task.load
    monkeypatch.setattr(task, 'load', lambda **kw: load(**kw).select([]))
    with pytest.raises(FusionError, match=r"task\(s\) 'shapes': the dataset is empty"):
        evaluate({'m': PRETRAINED}, mp, tp, progress=False)

def test_autocast_evaluates_in_lower_precision(pools):
    mp, tp = pools
    full = evaluate({'m': PRETRAINED}, mp, tp, progress=False)
    bf16 = evaluate({'m': PRETRAINED}, mp, tp, progress=False, autocast='bfloat16')
    loss = lambda r: r[r.metric == 'loss'].value.to_numpy()
    assert loss(bf16) == pytest.approx(loss(full), rel=0.05)        # bfloat16 keeps 8 bits of mantissa
    assert not (loss(bf16) == loss(full)).all()                     # ... and it did run in bfloat16
    with pytest.raises(HyperparameterError, match="autocast='fp8': expected one of none, bfloat16, float16"):
        evaluate({'m': PRETRAINED}, mp, tp, progress=False, autocast='fp8')

def test_benchmark_runs_and_counts_every_image(micro_project, capsys):
    bench = bench_module('eval_throughput')
    threads = torch.get_num_threads()
    out = bench.main(['--profile', 'micro-test', '--settings', str(micro_project/'settings.ini'), '--repeat', '1', '--workers', '0', '1'])
    printed = capsys.readouterr().out
    assert torch.get_num_threads() == threads
    assert '24 test images of 2 task(s), batches of 5' in printed   # 12 test images per micro task
    assert 'evaluate, 1 DataLoader worker(s)' in printed and 'of bare (goal ≥ 0.90)' in printed
    assert set(out) == {'bare', 'evaluate_w0', 'ratio_w0', 'evaluate_w1', 'ratio_w1'} and all(v > 0 for v in out.values())
    assert out['ratio_w0'] == pytest.approx(out['evaluate_w0'] / out['bare'], rel=1e-6)   # one repeat: the ratio of the rates

# --- pinned hub revisions ------------------------------------------------------------------------------------------

def fake_cache(root, kind, repo, commits):
    "A Hugging Face cache entry as huggingface_hub lays it out: commit → (refs, files); files are blobs linked from snapshots."
    d = Path(root)/f"{kind}s--{repo.replace('/', '--')}"
    for commit, (refs, files) in commits.items():
        snap = d/'snapshots'/commit; snap.mkdir(parents=True)
        for name, data in files.items():
            blob = d/'blobs'/f'{commit[:6]}-{name}'; blob.parent.mkdir(parents=True, exist_ok=True); blob.write_bytes(data)
            (snap/name).symlink_to(blob)
        for r in refs: (d/'refs').mkdir(exist_ok=True); (d/'refs'/r).write_text(commit)
    return d

A, B = 'a' * 40, 'b' * 40

def test_a_pinned_model_revision_loads_that_commit(tmp_path, monkeypatch):
    monkeypatch.setenv('HF_HUB_OFFLINE', '1')
    files = lambda tag: {'config.json': json.dumps({'tag': tag}).encode(), 'model.safetensors': b'x'}
    fake_cache(tmp_path, 'model', 'nobody/clip', {A: (['main'], files('main')), B: (['v1.0'], files('v1'))})
    assert resolve_model_dir('nobody/clip', cache_dir=tmp_path) == tmp_path/'models--nobody--clip'/'snapshots'/A
    assert resolve_model_dir('nobody/clip@v1.0', cache_dir=tmp_path) == tmp_path/'models--nobody--clip'/'snapshots'/B
    assert resolve_model_dir(f'nobody/clip@{B}', cache_dir=tmp_path).name == B
    with pytest.raises(FusionError, match="no revision after '@'"):
        resolve_model_dir('nobody/clip@', cache_dir=tmp_path)

def test_a_pinned_dataset_revision_is_passed_to_datasets(monkeypatch):
    calls = []
    monkeypatch.setattr(fusion_nb.pools, 'load_dataset', lambda *a, **kw: calls.append((a, kw)) or (_ for _ in ()).throw(FileNotFoundError('stop')))
    with pytest.raises(FusionError):
        load_split('ufldl-stanford/svhn@abc123:cropped_digits', 'test', 'svhn')
    assert calls == [(('ufldl-stanford/svhn', 'cropped_digits'), {'split': 'test', 'revision': 'abc123'})]

def test_inputs_json_records_the_resolved_commits(project, tmp_path, monkeypatch):
    "A profile reading hub ids: each run's inputs.json says which commit each id resolved to in the local cache."
    import huggingface_hub.utils._cache_manager as cache_manager
    cache = tmp_path/'hub'
    fake_cache(cache, 'model', 'nobody/clip', {A: (['main'], {'config.json': b'{}'})})
    fake_cache(cache, 'model', 'nobody/clip_a', {B: (['v2'], {'config.json': b'{}'})})
    fake_cache(cache, 'dataset', 'nobody/a', {B: (['main'], {'data.parquet': b'x'})})
    monkeypatch.setattr(cache_manager, 'HF_HUB_CACHE', str(cache))   # scan_cache_dir's default cache
    (project/'settings.ini').write_text(SETTINGS.replace('./models/none_{task}', 'nobody/clip_{task}@v2').replace('./models/none', 'nobody/clip')
                                        .replace('./datasets/{task}', 'nobody/{task}'))
    assert reproduce('demo', only=['00'], progress=False, log=lambda *_: None) == {'00_ok': 'ok'}
    inputs = json.loads((project/'outputs'/'demo'/'00_ok'/'inputs.json').read_text())
    assert inputs['hub_revisions'] == {'nobody/clip': A, 'nobody/clip_a@v2': B, 'nobody/clip_b@v2': None, 'nobody/a': B, 'nobody/b': None}
    assert inputs['profile']['experts']['a'] == 'nobody/clip_a@v2'   # the pin itself is part of the fingerprint
    assert resolved_revisions(load_profile('demo', settings=project/'settings.ini'), cache) == inputs['hub_revisions']
