"""The matrix of bad inputs (issue 11) and what each gets now: an error of fusion_nb's classes naming the culprit.

Each row of `LIBRARY` is (case, setup → callable, expected exception type, message fragments); each row of `CLI` is
(case, setup, fusion-nb arguments, exit status, stderr fragments). A change that regresses a message or lets a raw
traceback through fails here. The last tests check that damaged built data is repaired, not trusted.

Issue 51 (nothing lost, nothing silent: the export API, mergekit-schema values, the errors a full disk gives) lists
sixteen defects; `ISSUE_51` below says where each is tested, and `test_issue_51_items_are_all_tested` keeps it true.
"""
import errno, json, os, subprocess, sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import CLIPVisionConfig, CLIPVisionModel

from fusion_nb.core import FusionError, HyperparameterError, IncompatibleModelsError, NonFiniteError, UnknownNameError

TINY_CFG = CLIPVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=16, patch_size=8)

def _model_dir(tmp, name='expert'):
    from fusion_nb.checkpoints import save_vision_model
    return save_vision_model(CLIPVisionModel(TINY_CFG).state_dict(), tmp/name, TINY_CFG)

def non_utf8_settings(tmp):
    (tmp/'settings.ini').write_bytes(b'[p]\npretrained = a/b\ndescription = caf\xe9\n')
    from fusion_nb.reproduce.profiles import list_profiles
    return lambda: list_profiles(tmp/'settings.ini')

def misspelt_key(tmp):
    (tmp/'settings.ini').write_text('[p]\npretrained = a/b\ntasks = x\nbach_size = 8\n')
    from fusion_nb.reproduce.profiles import load_profile
    return lambda: load_profile('p', settings=tmp/'settings.ini')

def truncated_build_manifest(tmp):
    (tmp/'data'/'micro').mkdir(parents=True); (tmp/'data'/'micro'/'manifest.json').write_text('{"scale": "micro", "fil')
    from fusion_nb.tiny.build import build_benchmark
    return lambda: build_benchmark('micro', tmp, progress=False)

def empty_safetensors(tmp):
    d = _model_dir(tmp); (d/'model.safetensors').write_bytes(b'')
    from fusion_nb.checkpoints import vision_state_dict
    return lambda: vision_state_dict(d, name='gtsrb')

def truncated_safetensors(tmp):
    d = _model_dir(tmp); f = d/'model.safetensors'; f.write_bytes(f.read_bytes()[:-40])
    from fusion_nb.checkpoints import vision_state_dict
    return lambda: [v for v in vision_state_dict(d, name='gtsrb').values()]

class Payload:
    def __reduce__(self): return (os.system, ('echo pwned',))

def refused_pickle(tmp):
    torch.save({'w': torch.zeros(1), 'x': Payload()}, tmp/'pytorch_model.bin')
    from fusion_nb.checkpoints import LazyStateDict
    return lambda: LazyStateDict(tmp, name='svhn')

def save_into_foreign_folder(tmp):
    (tmp/'out').mkdir(); (tmp/'out'/'notes.md').write_text('mine')
    from fusion_nb.checkpoints import save_vision_model
    return lambda: save_vision_model(CLIPVisionModel(TINY_CFG).state_dict(), tmp/'out', TINY_CFG)

def cuda_without_gpu(tmp):
    from fusion_nb.core import get_device
    return lambda: get_device('cuda')

def cuda_profile_without_gpu(tmp):
    (tmp/'settings.ini').write_text('[gpu]\npretrained = ./m\ntasks = x\ndevice = cuda\n')
    from fusion_nb.reproduce.profiles import load_profile, prepare
    return lambda: prepare(load_profile('gpu', settings=tmp/'settings.ini'), log=lambda s: None)

def only_empty_name(tmp):
    from fusion_nb.reproduce.profiles import select_experiments
    return lambda: select_experiments(['00_a', '01_b'], [''])

def empty_test_split(tmp):
    import datasets
    from datasets import ClassLabel, Dataset, DatasetDict
    from PIL import Image
    f = datasets.Features({'image': datasets.Image(), 'label': ClassLabel(names=['a', 'b'])})
    DatasetDict({'train': Dataset.from_dict({'image': [Image.new('RGB', (4, 4))], 'label': [0]}, features=f),
                 'test': Dataset.from_dict({'image': [], 'label': []}, features=f)}).save_to_disk(str(tmp/'ds'))
    from fusion_nb.pools import Task
    return lambda: Task('toy', tmp/'ds').load()

def unwritable_output_root(tmp):
    (tmp/'afile').write_text('')
    from fusion_nb.reproduce.runner import writable_profile_dir
    return lambda: writable_profile_dir(tmp/'afile', 'tiny')

def bad_thread_override(tmp):
    from fusion_nb.tiny.build import build_threads
    os.environ['FUSION_NB_BUILD_THREADS'] = '0'
    return build_threads

# --- issue 26 (items 6, 11, 13: i26) ---------------------------------------------------------------------------------

def non_utf8_on_line_371(tmp):
    (tmp/'settings.ini').write_bytes(b'[p]\npretrained = a/b\n' + b'# a long comment, line after line, past a decode chunk\n' * 368 + b'x = caf\xe9\n')
    from fusion_nb.reproduce.profiles import list_profiles
    return lambda: list_profiles(tmp/'settings.ini')

def _with_root(tmp, call):
    "`call` with FUSION_NB_ROOT at `tmp` (a merge config's profile is read from the project's settings.ini)."
    def run():
        old = os.environ.get('FUSION_NB_ROOT'); os.environ['FUSION_NB_ROOT'] = str(tmp)
        try: return call()
        finally:
            if old is None: os.environ.pop('FUSION_NB_ROOT', None)
            else: os.environ['FUSION_NB_ROOT'] = old
    return run

def bad_budget_in_settings(tmp):
    (tmp/'settings.ini').write_text('[p]\npretrained = ./m\ntasks = a b\nexpert_template = ./m_{task}\nadamerging_steps = -5\n')
    from fusion_nb.reproduce.merge_config import load_merge_config
    return _with_root(tmp, lambda: load_merge_config({'method': 'layer_wise_adamerging', 'profile': 'p', 'base_model': './m',
                                                      'models': [{'model': './m_a'}, {'model': './m_b'}]}))

def template_without_task(tmp):
    (tmp/'settings.ini').write_text('[p]\npretrained = ./m\ntasks = a b\nexpert_template = ./models/expert\n')
    from fusion_nb.reproduce.profiles import load_profile
    return lambda: load_profile('p', settings=tmp/'settings.ini')

def experts_named_like_the_base(tmp):
    from fusion_nb.merge import merge
    e = {'w': torch.ones(3)}
    return lambda: merge('task_arithmetic', {'w': torch.zeros(4)}, {'pretrained': e, '_pretrained_': e}, progress=False)

def experts_none(tmp):
    from fusion_nb.merge import merge
    return lambda: merge('task_arithmetic', {'w': torch.zeros(3)}, None, progress=False)

def nan_weights_saved(tmp):
    from fusion_nb.checkpoints import save_state_dict
    return lambda: save_state_dict({'w': torch.tensor([1.0, float('nan')])}, tmp/'w.safetensors')

def truncated_arrow(tmp):
    from conftest import micro_dataset
    d = micro_dataset(tmp/'ds', ['a', 'b'], splits={'train': 4, 'test': 8})
    f = next((d/'test').glob('*.arrow')); f.write_bytes(f.read_bytes()[:len(f.read_bytes()) // 2])
    from fusion_nb.pools import Task
    return lambda: Task('toy', d).load()

# --- issue 51 (items 11, 13, 16: i51) ---------------------------------------------------------------------------------

def nan_lambda(tmp):
    from fusion_nb.merge import merge
    return lambda: merge('ties_merging', {'w': torch.zeros(3)}, {'a': {'w': torch.ones(3)}}, scaling_factor=float('nan'), progress=False)

def multislerp_weights_summing_to_0(tmp):
    from fusion_nb.merge import merge
    e = {n: {'w': torch.tensor(v)} for n, v in {'a': [1., 0.], 'b': [0., 1.], 'c': [1., 1.]}.items()}
    return lambda: merge('multislerp', None, e, weight=[0, 0, 0], progress=False)

def read_only_output_folder(tmp):
    "As a read-only folder refuses the temporary (made by hand: root, as CI runs, writes anywhere)."
    from unittest import mock
    from fusion_nb.core import atomic_dir
    def refused(*a, dir=None, prefix='', **k): raise PermissionError(errno.EACCES, 'Permission denied', str(Path(dir)/f'{prefix}x.tmp'))
    def write():
        with mock.patch('tempfile.mkdtemp', refused), atomic_dir(tmp/'out'): pass
    return write

def disk_fills_while_writing(tmp):
    "As safetensors reports a full disk halfway through a model (made by hand: no real disk is filled)."
    from safetensors import SafetensorError
    from fusion_nb.core import atomic_dir
    def write():
        with atomic_dir(tmp/'out') as t:
            (t/'model.safetensors').write_bytes(b'0' * 5000)
            raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })')
    return write

LIBRARY = [  # case, setup, exception, message fragments (all must appear), fragments that must not
    ('settings.ini with a non-UTF-8 byte', non_utf8_settings, FusionError, ['settings.ini is not UTF-8 text: byte 0xe9 on line 3'], []),
    ('misspelt settings.ini key', misspelt_key, FusionError, ["profile 'p'", "unknown key 'bach_size' (did you mean 'batch_size'"], []),
    ('truncated build manifest.json', truncated_build_manifest, FusionError, ["micro/manifest.json is not a readable build manifest (truncated", 'Delete it'], []),
    ('empty safetensors file', empty_safetensors, FusionError, ["model 'gtsrb'", "model.safetensors' is not a valid safetensors file (empty"], []),
    ('truncated safetensors file', truncated_safetensors, FusionError, ["model 'gtsrb'", 'is not a valid safetensors file', 'truncated or corrupt'], []),
    ('pickle with code in it', refused_pickle, FusionError, ["model 'svhn'", "pytorch_model.bin' is a pickle that holds more than tensors", 'system'], ['weights_only']),
    ('save_vision_model into a folder with other files', save_into_foreign_folder, FusionError, ['(notes.md), which saving would delete'], []),
    ("device='cuda' without a GPU", cuda_without_gpu, FusionError, ["device 'cuda' requested but CUDA is not available"], []),
    ('profile with device = cuda without a GPU', cuda_profile_without_gpu, FusionError, ["profile 'gpu': device 'cuda' requested"], []),
    ("--only ''", only_empty_name, UnknownNameError, ["no experiment named in ['']. Experiments: 00_a, 01_b"], []),
    ('empty test split', empty_test_split, FusionError, ["dataset of task 'toy': split 'test' of", 'is empty (0 examples)'], []),
    ('unwritable output root', unwritable_output_root, FusionError, ["cannot write the outputs of profile 'tiny' to", '--output-root'], []),
    ('FUSION_NB_BUILD_THREADS=0', bad_thread_override, HyperparameterError, ["FUSION_NB_BUILD_THREADS='0': expected an integer ≥ 1"], []),
    # issue 26
    ('11: non-UTF-8 byte on line 371 of settings.ini', non_utf8_on_line_371, FusionError, ['is not UTF-8 text: byte 0xe9 on line 371;'], []),
    ('13: bad budget in settings.ini, read for a merge config', bad_budget_in_settings, FusionError,
     ["profile: profile 'p' in", "settings.ini: adamerging_steps = '-5' is invalid: expected an integer in [0, inf)"], ['steps=-5']),
    ('6: expert_template without {task}', template_without_task, FusionError,
     ["profile 'p': expert_template = './models/expert' is invalid: it has no {task}, so tasks a, b would all get the same expert"], []),
    ("6: experts named 'pretrained' and '_pretrained_'", experts_named_like_the_base, IncompatibleModelsError,
     ["tensor 'w': shape [3] in model 'pretrained' but [4] in 'θ₀ (the pretrained model)'"], []),
    ('11: experts=None', experts_none, HyperparameterError, ["task_arithmetic: experts is None; pass the models to merge"], []),
    ('6: save_state_dict with NaN', nan_weights_saved, NonFiniteError, ["w.safetensors': tensor 'w' holds 1 NaN and 0 Inf value(s)"], []),
    ('11: truncated .arrow file', truncated_arrow, FusionError,
     ["dataset of task 'toy': split 'test' of", "cannot be read: one of its files (data-00000-of-00001.arrow) is truncated or corrupt"], []),
    # issue 51
    ('51.11: a read-only output folder', read_only_output_folder, FusionError,
     ["/out': its folder", 'is not writable (Permission denied). Choose a writable folder, or make that one writable'], ['.tmp']),
    ('51.11: the disk fills while writing', disk_fills_while_writing, FusionError,
     ["/out': no space left on its disk (5.0 kB had been written when it filled", 'the partial output was removed). Free at least 5.0 kB'],
     ['.tmp', 'SafetensorError', 'IoError']),
    ('51.13: scaling_factor = nan', nan_lambda, HyperparameterError, ['ties_merging: scaling_factor=nan is out of range: scaling_factor (λ) is not finite'], []),
    ('51.16: multislerp weight=[0, 0, 0]', multislerp_weights_summing_to_0, HyperparameterError,
     ['multislerp: the weights sum to 0 (a: 0, b: 0, c: 0), and normalize_weights divides them by their sum'], ['NaN']),
]

@pytest.mark.parametrize('case, setup, exc, parts, absent', LIBRARY, ids=[c[0] for c in LIBRARY])
def test_bad_input_gets_a_clear_error(case, setup, exc, parts, absent, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)   # the GPU cases hold on a GPU machine too
    monkeypatch.delenv('FUSION_NB_BUILD_THREADS', raising=False)
    call = setup(tmp_path)
    try:
        with pytest.raises(exc) as e: call()
    finally: os.environ.pop('FUSION_NB_BUILD_THREADS', None)
    for p in parts: assert p in str(e.value), (case, str(e.value))
    for a in absent: assert a not in str(e.value), (case, str(e.value))

def test_merge_on_cuda_without_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    from fusion_nb.merge import merge
    with pytest.raises(FusionError, match="CUDA is not available"):
        merge('task_arithmetic', {'w': torch.zeros(2)}, {'a': {'w': torch.ones(2)}}, device='cuda', progress=False)

# --- the command line: exit status 2 and one line, never a traceback -------------------------------------------------

GOOD = '[demo]\ntasks = a\npretrained = ./models/none\nexpert_template = ./models/none_{task}\ndataset_template = ./datasets/{task}\n'

def _project(tmp, settings):
    (tmp/'nbs'/'experiments').mkdir(parents=True)
    import nbformat
    nb = nbformat.v4.new_notebook(); c = nbformat.v4.new_code_cell("profile = 'demo'\noutput_dir = None"); c.metadata['tags'] = ['parameters']
    nb.cells = [nbformat.v4.new_markdown_cell('# A'), c, nbformat.v4.new_code_cell('1')]
    nb.metadata['kernelspec'] = {'name': 'python3', 'display_name': 'Python 3', 'language': 'python'}
    nbformat.write(nb, str(tmp/'nbs'/'experiments'/'00_a.ipynb'))
    (tmp/'settings.ini').write_bytes(settings if isinstance(settings, bytes) else settings.encode())
    from conftest import scratch_sources
    return scratch_sources(tmp, tasks='a')

CLI = [  # case, settings.ini, arguments, exit status, stderr fragments
    ('fusion-nb list with a non-UTF-8 settings.ini', b'[demo]\npretrained = a/b\n# caf\xe9\n', ['list'], 2, ['is not UTF-8 text: byte 0xe9 on line 3']),
    ('misspelt key', GOOD + 'bach_size = 8\n', ['reproduce', '--profile', 'demo'], 2, ["unknown key 'bach_size' (did you mean 'batch_size'"]),
    ("--only ''", GOOD, ['reproduce', '--profile', 'demo', '--only', ''], 2, ["no experiment named in ['']"]),
    ('unwritable output root', GOOD, ['reproduce', '--profile', 'demo', '--output-root', '{tmp}/afile'], 2, ['cannot write the outputs', 'choose a writable folder']),
    ('device = cuda without a GPU', GOOD + 'device = cuda\n', ['reproduce', '--profile', 'demo'], 2, ["profile 'demo': device 'cuda' requested but CUDA is not available"]),
]

@pytest.mark.parametrize('case, settings, args, status, parts', CLI, ids=[c[0] for c in CLI])
def test_cli_bad_input(case, settings, args, status, parts, tmp_path):
    if 'cuda' in case and torch.cuda.is_available(): pytest.skip('this machine has a GPU')
    root = _project(tmp_path, settings); (root/'afile').write_text('')
    r = subprocess.run([sys.executable, '-c', 'import sys; from fusion_nb.reproduce.cli import main; raise SystemExit(main(sys.argv[1:]))',
                        *[a.format(tmp=root) for a in args]], env={**os.environ, 'FUSION_NB_ROOT': str(root)}, capture_output=True, text=True)
    assert r.returncode == status, r.stderr
    assert 'Traceback' not in r.stderr and r.stderr.startswith('fusion-nb: error: '), r.stderr
    for p in parts: assert p in r.stderr, r.stderr

# --- issue 26, the items tested where their code lives ---------------------------------------------------------------
# (item, file, the test there, a fragment of the error or check it asserts). The test below keeps this list true: each
# named test exists and still asserts that fragment. Items 2, 6, 7, 11, 12, 13 and 15 are rows or tests of this file.
ELSEWHERE_26 = [
    ('1: merge_llava into a folder with a user\'s notes.txt and sub/', 'nbs/llava/62_uq_merge.ipynb', "a user's folder is never emptied", 'holds notes.txt, sub'),
    ('3: uq_merge\'s out_dir/merged/ holding a user\'s file', 'tests/llava/test_llava.py',
     'test_uq_merge_never_deletes_a_users_files_in_out_dir_merged', 'merged/notes.txt, which uq_merge did not write'),
    ('4: float16 export past 65504 (inf after the cast)', 'tests/reproduce/test_export.py', 'test_float16_overflow_is_refused_after_the_cast',
     "holds \\d+ NaN/Inf value\\(s\\) in torch.float16"),
    ('5: attack step_size < 0, topk outside (0, 1]', 'tests/robust/test_attacks.py', 'issue 26 item 5', 'topk=0 is out of range'),
    ('8: scaling_factor 1e39 overflows float32', 'tests/reproduce/test_merge_cli.py', 'issue 26.8', 'merges compute in float32'),
    ('9: --backend ray --address 127.0.0.1:1 hung', 'tests/reproduce/test_ray.py', 'test_an_unreachable_address_fails_in_time_naming_it',
     'cannot reach the Ray cluster at'),
    ('10: n_train % batch_size == 1 in counterfactual fine-tuning', 'tests/masking/test_masking.py', 'test_one_image_last_batch_fine_tunes',
     'the one-image step: no counterfactual term'),
    ('13: method: neulig in a merge config trained, then failed', 'tests/reproduce/test_merge_cli.py', 'issue 26.13', 'neulig cannot be merged into one model'),
    ('14: model.safetensors mode 0600', 'tests/reproduce/test_export.py', 'test_saved_files_honour_the_umask', 'oct(0o644)'),
]

@pytest.mark.parametrize('item, path, test, fragment', ELSEWHERE_26, ids=[i[0][:40] for i in ELSEWHERE_26])
def test_issue_26_items_tested_elsewhere(item, path, test, fragment):
    text = (Path(__file__).parents[1]/path).read_text()
    assert test in text and fragment in text, (item, path)

# --- issue 51: where each of its sixteen items is tested ---------------------------------------------------------------
# (item, file, test, a fragment that test asserts). Rows with a fragment are checked below; rows without one are tested by
# other changes of the same issue (the mergekit-schema items and consensus_k) and get their fragment when those land.
ISSUE_51 = [
    ("1: export_model(extra_files={'../notes.txt': f}) wrote outside the folder; 'model.safetensors' replaced the weights",
     'tests/reproduce/test_export.py', 'test_issue_51_1_extra_files_stay_inside_the_folder_and_replace_nothing_it_writes',
     "is not a name inside the export folder"),
    ('2: rerunning fusion-nb merge into an earlier export replaced the README.md the user edited',
     'tests/reproduce/test_export.py', 'test_issue_51_2_fusion_nb_merge_rerun_keeps_the_edited_card', "(out/'README.md').read_text() == edited"),
    ('2: ... the same for a mergekit-schema merge', 'tests/reproduce/test_bad_mergekit_inputs.py', 'test_rerun_keeps_the_card_the_user_edited',
     "(out/'README.fusion_nb.md').exists()"),
    ('3: mergekit normalize: "no" (quoted) merged as normalize: true', 'tests/reproduce/test_bad_mergekit_inputs.py', 'test_quoted_no_for_normalize_is_false', "['no', 'false', 'False', 'off']"),
    ('4: consensus_k larger than the number of experts returned θ₀', 'tests/methods/test_sota_methods.py or nbs/methods/44_consensus.ipynb', 'item 4', None),
    ('5: export_model wrote NaN without dtype=, and integers with dtype=torch.int8', 'tests/reproduce/test_export.py',
     'test_issue_51_5_non_float_dtypes_are_refused', 'is not a float dtype: export in one of float32, float16, bfloat16, float64'),
    ("6: export_model(result, method='ties_merging') of a task-arithmetic result wrote a TIES card", 'tests/reproduce/test_export.py',
     'test_issue_51_6_a_method_other_than_the_results_is_refused', "but the result was made by 'task_arithmetic'"),
    ('7: a deeper expert merged into a shallower base dropped its extra layer', 'tests/reproduce/test_bad_mergekit_inputs.py', 'test_deeper_expert_is_refused', "the base \\(.*base\\) lacks"),
    ('8: duplicate YAML keys: the last won', 'tests/reproduce/test_bad_mergekit_inputs.py', 'test_duplicate_keys_refused', "key 'method' is given twice"),
    ('9: mergekit nuslerp with weights 0 and 0 merged', 'tests/reproduce/test_bad_mergekit_inputs.py', 'test_nuslerp_weights_summing_to_zero', "sum to 0"),
    ("10: weight: abc / density: '50%' gave a raw ValueError", 'tests/reproduce/test_bad_mergekit_inputs.py', 'test_bad_values_named_in_mergekit_words', "'abc' is not a number"),
    ('11: a read-only output folder named the temporary; a full disk gave a raw SafetensorError', 'tests/test_bad_inputs.py',
     'disk_fills_while_writing', 'no space left on its disk'),
    ('11: ... the same through export_model (how much to free: what the export needs)', 'tests/reproduce/test_export.py',
     'test_issue_51_11_a_full_disk_names_the_folder_and_what_to_free', 'Free at least'),
    ("12: mergekit parameters reported under this project's names, no model named", 'tests/reproduce/test_bad_mergekit_inputs.py', 'test_bad_values_named_in_mergekit_words', "density: 0 is out of range"),
    ('13: lambda: .nan named no parameter', 'tests/test_bad_inputs.py', 'nan_lambda', 'scaling_factor (λ) is not finite'),
    ("13: ... the same in a mergekit config's ties", 'tests/reproduce/test_bad_mergekit_inputs.py', 'test_nan_lambda_names_the_parameter', "'lambda': float('nan')"),
    ('14: a GPT-2 expert beside a Llama base: a made-up name, no path', 'tests/reproduce/test_bad_mergekit_inputs.py', 'test_gpt2_beside_llama_names_the_architectures', "another architecture"),
    ('15: models: [] said "expected a list"', 'tests/reproduce/test_bad_mergekit_inputs.py', 'test_empty_models_list', 'models: the list is empty'),
    ('16: multislerp with weight=[0, 0, 0]: a NaN error without the cause', 'tests/test_bad_inputs.py', 'multislerp_weights_summing_to_0',
     'the weights sum to 0 (a: 0, b: 0, c: 0)'),
]

def test_issue_51_items_are_all_tested():
    assert sorted({int(i[0].split(':')[0]) for i in ISSUE_51}) == list(range(1, 17))
    for item, path, test, fragment in ISSUE_51:
        if fragment is None: continue
        text = (Path(__file__).parents[1]/path).read_text()
        assert test in text and fragment in text, (item, path)

# --- issue 26 on the command line (items 2, 7, 12, 13: i26) ----------------------------------------------------------

def _users_notes(root):
    (root/'outputs'/'demo'/'00_a').mkdir(parents=True); (root/'outputs'/'demo'/'00_a'/'my_notes.md').write_text('mine')
    return [root/'outputs'/'demo'/'00_a'/'my_notes.md']

def _empty_notebook(root):
    (root/'nbs'/'experiments'/'Untitled.ipynb').write_text('')
    return [root/'nbs'/'experiments'/'Untitled.ipynb']

MODULE = [sys.executable, '-m', 'fusion_nb.reproduce.cli']
CLI_26 = [  # case, settings.ini, setup (→ files that must survive), command, exit status, stream, fragments
    ('2: a file of the user in an experiment folder', GOOD, _users_notes, ['reproduce', '--profile', 'demo', '--force'], 2, 'stderr',
     ['fusion-nb: error: [00_a]', 'holds 1 file(s) the runner did not write (my_notes.md)', 'Move them out of it']),
    ('7: an empty Untitled.ipynb, reproduce', GOOD, _empty_notebook, ['reproduce', '--profile', 'demo'], 2, 'stderr',
     ['fusion-nb: error: experiment notebook', 'Untitled.ipynb is not a readable notebook (JSONDecodeError: Expecting value']),
    ('7: an empty Untitled.ipynb, list', GOOD, _empty_notebook, ['list'], 0, 'stdout',
     ['00_a', 'Untitled', '(unreadable: experiment notebook']),
    ('13: a bad budget in settings.ini', GOOD + 'adamerging_steps = -5\n', None, ['reproduce', '--profile', 'demo'], 2, 'stderr',
     ["fusion-nb: error: profile 'demo' in", "settings.ini: adamerging_steps = '-5' is invalid: expected an integer in [0, inf)"]),
    ('13: python -m fusion_nb.reproduce.cli list', GOOD, None, ['list'], 0, 'stdout', ['demo', '00_a']),
    ('13: python -m fusion_nb.reproduce.cli without a command', GOOD, None, [], 2, 'stderr', ['usage: fusion-nb', 'required: cmd']),
]

@pytest.mark.parametrize('case, settings, setup, args, status, stream, parts', CLI_26, ids=[c[0] for c in CLI_26])
def test_cli_bad_input_26(case, settings, setup, args, status, stream, parts, tmp_path):
    "Each as `python -m fusion_nb.reproduce.cli` (item 13: it ran nothing and exited 0), which is `fusion-nb`."
    root = _project(tmp_path, settings)
    kept = setup(root) if setup else []
    r = subprocess.run([*MODULE, *args], env={**os.environ, 'FUSION_NB_ROOT': str(root)}, capture_output=True, text=True, cwd=root)
    assert r.returncode == status and 'Traceback' not in r.stderr, (r.returncode, r.stderr)
    for p in parts: assert p in getattr(r, stream), getattr(r, stream)
    assert all(f.exists() for f in kept) and not (root/'outputs'/'demo'/'00_a'/'run.ipynb').exists()   # nothing deleted, nothing ran

SLOW = "from pathlib import Path\nPath(output_dir, 'started').write_text('')\nimport time\ntime.sleep(120)"

def test_ctrl_c_during_reproduce_is_one_line_and_leaves_only_what_it_finished_as_partial(tmp_path):
    """Item 12: Ctrl-C (SIGINT to the process group, as a terminal sends it) printed a 20-line ZMQ traceback and left a .failed.ipynb.
    Since issue 54 what the interrupted experiment had written is kept apart, as partial, never as its output folder."""
    import nbformat, signal, time
    root = _project(tmp_path, GOOD)
    nb = nbformat.read(str(root/'nbs'/'experiments'/'00_a.ipynb'), as_version=4); nb.cells[-1].source = SLOW
    nbformat.write(nb, str(root/'nbs'/'experiments'/'00_a.ipynb'))
    p = subprocess.Popen([*MODULE, 'reproduce', '--profile', 'demo', '--no-progress'], env={**os.environ, 'FUSION_NB_ROOT': str(root)},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    t0 = time.time()
    while not list((root/'outputs').rglob('started')) and time.time() - t0 < 90 and p.poll() is None: time.sleep(0.1)
    os.killpg(p.pid, signal.SIGINT)
    out, err = p.communicate(timeout=180)   # 13 s alone; once over 60 s in CI beside an experiment run (2 cores, load ~4)
    assert p.returncode == 130 and 'Traceback' not in err and 'ZMQError' not in err, err
    assert err.strip().splitlines()[-1] == 'fusion-nb: interrupted; finished experiments keep their outputs', err
    # no .failed.ipynb/.json, no temporaries, no half-written 00_a/: the files it wrote lie in 00_a.partial/, which REPORT.md flags
    assert sorted(f.name for f in (root/'outputs'/'demo').iterdir()) == ['00_a.partial', 'REPORT.md']
    assert json.loads((root/'outputs'/'demo'/'00_a.partial'/'partial.json').read_text())['stopped'] == 'interrupted'
    assert '**Partial outputs** (runs that did not finish, not complete results): 00_a.' in (root/'outputs'/'demo'/'REPORT.md').read_text()

def test_a_cell_that_does_not_apply_prints_a_dash(tmp_path):
    "Item 15: experiment 01's Ens./Gap of TIES and the pre-trained row printed `nan`; the papers print a dash."
    import pandas as pd
    from fusion_nb.reproduce.reports import save_table
    t = pd.DataFrame({'Mer.': [48.2, 69.1], 'Ens.': [float('nan'), 72.3], 'Gap': [float('nan'), -3.2]},
                     index=pd.Index(['Pre-trained', 'TIES'], name='method'))
    md, csv = (save_table(t, tmp_path, 'table')[k] for k in ('md', 'csv'))
    assert 'nan' not in md.read_text() and [c.strip() for c in md.read_text().splitlines()[2].strip('|').split('|')] == ['Pre-trained', '48.2', '–', '–']
    assert pd.read_csv(csv, index_col=0).loc['Pre-trained'].isna().tolist() == [False, True, True]

# --- damaged built data is rebuilt, not trusted ----------------------------------------------------------------------

@pytest.fixture(scope='module')
def micro(tmp_path_factory):
    from fusion_nb.tiny.build import build_benchmark, read_manifest
    import shutil
    root = tmp_path_factory.mktemp('damaged'); repo = Path(__file__).resolve().parents[1]/'data'/'micro'
    build_benchmark('micro', repo.parents[1], progress=False, log=lambda s: None)   # the checkout's, built on first use without workers
    shutil.copytree(repo/'datasets', root/'data'/'micro'/'datasets'); shutil.copy(repo/'manifest.json', root/'data'/'micro'/'manifest.json')
    build_benchmark('micro', root, progress=False, log=lambda s: None)   # the checkout's datasets kept; the zoo trained here, as its rebuilds below
    return root, read_manifest('micro', root)['files']

def _rebuild(root):
    from fusion_nb.tiny.build import build_benchmark, read_manifest, verify_benchmark
    notes = []
    build_benchmark('micro', root, progress=False, log=notes.append)
    m = read_manifest('micro', root)
    assert verify_benchmark('micro', root) == []
    return m, '\n'.join(notes)

def test_nan_in_an_expert_is_rebuilt(micro):
    root, files = micro
    f = root/'data'/'micro'/'models'/'clip-vit-tiny_mnist'/'model.safetensors'
    sd = load_file(f); k = next(k for k, v in sd.items() if v.is_floating_point()); sd[k].view(-1)[0] = float('nan')
    save_file(sd, f, metadata={'format': 'pt'})
    m, notes = _rebuild(root)
    assert '1 file(s) of' in notes and 'clip-vit-tiny_mnist/model.safetensors' in notes
    assert m['rebuilt_now']['models'] == ['mnist'] and m['files'] == files   # the same bytes as before the damage

def test_swapped_experts_are_rebuilt(micro):
    root, files = micro
    models = root/'data'/'micro'/'models'
    a, b = models/'clip-vit-tiny_svhn', models/'clip-vit-tiny_gtsrb'
    a.rename(models/'swap'); b.rename(a); (models/'swap').rename(b)
    m, _ = _rebuild(root)
    assert sorted(m['rebuilt_now']['models']) == ['gtsrb', 'svhn'] and m['files'] == files

def test_a_deleted_split_is_rebuilt(micro):
    import shutil
    root, files = micro
    shutil.rmtree(root/'data'/'micro'/'datasets'/'eurosat'/'test')
    m, _ = _rebuild(root)
    assert m['rebuilt_now']['datasets'] == ['eurosat'] and 'eurosat' in m['rebuilt_now']['models'] and m['files'] == files
