"""Paper 004 at paper scale: every held-in / held-out adapter of fusion_nb.llava.benchmarks maps rows of a dataset with its
hub copy's columns and features (from the lmms-lab dataset cards) to the same items as a naive hand mapping, after a
`save_to_disk` round trip; offline, the paper profile's sets fail at once, each named."""
import ast

import numpy as np
import pytest
from PIL import Image
from datasets import Dataset, DatasetDict, Features, Image as DImage, Sequence as DSeq, Value

from fusion_nb.core import FusionError
from fusion_nb.llava.benchmarks import BENCHMARKS, check_benchmarks, load_benchmark, load_benchmarks, UNANSWERABLE_PROMPT
from fusion_nb.llava.short_answers import SHORT_ANSWER_PROMPT
from fusion_nb.llava.uncertainty import ANSWER_PROMPT
from fusion_nb.reproduce.profiles import load_profile
from conftest import PAPERMILL

S = lambda: Value('string')
COLOURS = ['red', 'green', 'blue', 'white', 'black', 'yellow']
def img(i): return Image.new('RGB', (6, 6), COLOURS[i % len(COLOURS)])
def px(im): return im.convert('RGB').getpixel((0, 0))

def roundtrip(tmp_path, name, data, features, as_dict=False):
    "Save rows like the hub copy's split (a Dataset, or a DatasetDict keyed by the split) and load them back as items."
    ds = Dataset.from_dict(data, features=Features(features))
    folder = tmp_path/name
    (DatasetDict({BENCHMARKS[name].split: ds}) if as_dict else ds).save_to_disk(str(folder))
    return load_benchmarks({name: str(folder)}, BENCHMARKS[name].role, hub_reachable=False)[name]

def option_view(items): return [(px(i.image), i.question, list(i.options), i.answer) for i in items]
def answer_view(items): return [(px(i.image), i.question, list(i.answers), i.instruction) for i in items]

def test_mmbench(tmp_path):
    data = {'index': [0, 1, 2], 'question': ['Q0?', 'Q1?', 'Q2?'], 'hint': ['nan', 'A hint.', None],
            'A': ['a0', 'a1', 'a2'], 'B': ['b0', 'b1', 'b2'], 'C': ['c0', 'nan', 'c2'], 'D': ['d0', None, ''],
            'answer': ['D', 'B', 'C'], 'category': ['x'] * 3, 'image': [img(0), img(1), img(2)],
            'source': ['s'] * 3, 'L2-category': ['y'] * 3, 'comment': ['nan'] * 3, 'split': ['dev'] * 3}
    feats = {'index': Value('int64'), 'question': S(), 'hint': S(), 'A': S(), 'B': S(), 'C': S(), 'D': S(), 'answer': S(),
             'category': S(), 'image': DImage(), 'source': S(), 'L2-category': S(), 'comment': S(), 'split': S()}
    want = [(px(img(0)), 'Q0?', ['a0', 'b0', 'c0', 'd0'], 3), (px(img(1)), 'A hint. Q1?', ['a1', 'b1'], 1), (px(img(2)), 'Q2?', ['a2', 'b2', 'c2'], 2)]
    assert option_view(roundtrip(tmp_path, 'mmbench', data, feats, as_dict=True)) == want

def test_oodcv_vqa_own_layout(tmp_path):
    data = {'image': [img(0), img(1)], 'question': ['How many cars?', 'How many dogs?'], 'options': [['One', 'Two', 'Three', 'Four']] * 2, 'answer': [1, -1]}
    feats = {'image': DImage(), 'question': S(), 'options': DSeq(S()), 'answer': Value('int64')}
    got = option_view(roundtrip(tmp_path, 'oodcv_vqa', data, feats))
    assert got == [(px(img(0)), 'How many cars?', ['One', 'Two', 'Three', 'Four'], 1), (px(img(1)), 'How many dogs?', ['One', 'Two', 'Three', 'Four'], None)]

def test_scienceqa_img(tmp_path):
    feats = {'image': DImage(), 'question': S(), 'choices': DSeq(S()), 'answer': Value('int8'), 'hint': S(), 'task': S(), 'grade': S(),
             'subject': S(), 'topic': S(), 'category': S(), 'skill': S(), 'lecture': S(), 'solution': S()}
    data = {'image': [img(3), None, img(4)], 'question': ['Which is hot?', 'No image?', 'Which map?'], 'choices': [['sun', 'ice'], ['x', 'y'], ['a', 'b', 'c']],
            'answer': [0, 1, 2], 'hint': ['Look at the sky.', '', ''], **{k: ['t'] * 3 for k in ['task', 'grade', 'subject', 'topic', 'category', 'skill', 'lecture', 'solution']}}
    want = [(px(img(3)), 'Context: Look at the sky.\nWhich is hot?', ['sun', 'ice'], 0), (px(img(4)), 'Which map?', ['a', 'b', 'c'], 2)]
    assert option_view(roundtrip(tmp_path, 'scienceqa_img', data, feats)) == want   # the row without an image is left out

def test_seedbench(tmp_path):
    feats = {'answer': S(), 'choice_a': S(), 'choice_b': S(), 'choice_c': S(), 'choice_d': S(), 'data_id': DSeq(S()), 'data_type': S(),
             'question': S(), 'question_id': S(), 'question_type_id': Value('int16'), 'image': DSeq(DImage())}
    data = {'answer': ['B', 'A', 'D'], 'choice_a': ['a0', 'a1', 'a2'], 'choice_b': ['b0', 'b1', 'b2'], 'choice_c': ['c0', 'c1', 'c2'], 'choice_d': ['d0', 'd1', 'd2'],
            'data_id': [['i0'], ['v1'] * 3, ['i2']], 'data_type': ['image', 'video', 'image'], 'question': ['Q0', 'Q1', 'Q2'],
            'question_id': ['0', '1', '2'], 'question_type_id': [1, 10, 9], 'image': [[img(0)], [img(1)] * 3, [img(2)]]}
    want = [(px(img(0)), 'Q0', ['a0', 'b0', 'c0', 'd0'], 1), (px(img(2)), 'Q2', ['a2', 'b2', 'c2', 'd2'], 3)]
    assert option_view(roundtrip(tmp_path, 'seedbench', data, feats)) == want   # the video question is left out

def test_ai2d(tmp_path):
    feats = {'question': S(), 'options': DSeq(S()), 'answer': S(), 'image': DImage()}
    data = {'question': ['Which stage?', 'What eats grass?'], 'options': [['egg', 'larva', 'adult'], ['cow', 'lion']], 'answer': ['2', '0'], 'image': [img(1), img(2)]}
    assert option_view(roundtrip(tmp_path, 'ai2d', data, feats)) == [(px(img(1)), 'Which stage?', ['egg', 'larva', 'adult'], 2), (px(img(2)), 'What eats grass?', ['cow', 'lion'], 0)]

@pytest.mark.parametrize('name, instruction, extra', [
    ('ok_vqa', UNANSWERABLE_PROMPT, {'question_id': S(), 'question_type': S(), 'answer_type': S()}),
    ('vizwiz_vqa', UNANSWERABLE_PROMPT, {'question_id': S(), 'category': S()}),
    ('textvqa', SHORT_ANSWER_PROMPT, {'image_id': S(), 'question_id': Value('int32'), 'question_tokens': DSeq(S()), 'ocr_tokens': DSeq(S())})])
def test_answers_lists(tmp_path, name, instruction, extra):
    n = 3
    data = {'image': [img(i) for i in range(n)], 'question': [f'Q{i}?' for i in range(n)], 'answers': [[f'a{i}'] * 9 + ['other'] for i in range(n)],
            **{k: ([['t']] * n if isinstance(f, DSeq) else [1] * n if f.dtype.startswith('int') else ['x'] * n) for k, f in extra.items()}}
    got = answer_view(roundtrip(tmp_path, name, data, {'image': DImage(), 'question': S(), 'answers': DSeq(S()), **extra}))
    assert got == [(px(img(i)), f'Q{i}?', [f'a{i}'] * 9 + ['other'], instruction) for i in range(n)]

def test_vqav2(tmp_path):
    rec = Features({'answer': S(), 'answer_confidence': S(), 'answer_id': Value('int64')})
    feats = {'question_type': S(), 'multiple_choice_answer': S(), 'answers': [{'answer': S(), 'answer_confidence': S(), 'answer_id': Value('int64')}],
             'image_id': Value('int64'), 'answer_type': S(), 'question_id': Value('int64'), 'question': S(), 'image': DImage()}
    answers = [[{'answer': a, 'answer_confidence': 'yes', 'answer_id': j} for j, a in enumerate(['2', 'two', '2'])], [{'answer': 'no', 'answer_confidence': 'maybe', 'answer_id': 1}]]
    data = {'question_type': ['how many', 'is'], 'multiple_choice_answer': ['2', 'no'], 'answers': answers, 'image_id': [1, 2],
            'answer_type': ['number', 'yes/no'], 'question_id': [1, 2], 'question': ['How many?', 'Is it?'], 'image': [img(0), img(1)]}
    got = answer_view(roundtrip(tmp_path, 'vqav2', data, feats))
    assert got == [(px(img(0)), 'How many?', ['2', 'two', '2'], SHORT_ANSWER_PROMPT), (px(img(1)), 'Is it?', ['no'], SHORT_ANSWER_PROMPT)]

def test_pope(tmp_path):
    feats = {'id': S(), 'question_id': S(), 'question': S(), 'answer': S(), 'image_source': S(), 'image': DImage(), 'category': S()}
    data = {'id': ['0', '1'], 'question_id': ['1', '2'], 'question': ['Is there a dog in the image?', 'Is there a cat in the image?'],
            'answer': ['yes', 'no'], 'image_source': ['a', 'b'], 'image': [img(2), img(3)], 'category': ['adversarial', 'random']}
    got = answer_view(roundtrip(tmp_path, 'pope', data, feats))
    assert got == [(px(img(2)), 'Is there a dog in the image?', ['yes'], SHORT_ANSWER_PROMPT), (px(img(3)), 'Is there a cat in the image?', ['no'], SHORT_ANSWER_PROMPT)]

def test_gqa_joins_images(tmp_path):
    qs = Dataset.from_dict({'id': ['q0', 'q1', 'q2'], 'imageId': ['n7', 'n3', 'n7'], 'question': ['Colour?', 'Left or right?', 'Material?'],
                            'answer': ['red', 'left', 'wood'], 'fullAnswer': ['x'] * 3})
    ims = Dataset.from_dict({'id': ['n3', 'n7'], 'image': [img(1), img(0)]}, features=Features({'id': S(), 'image': DImage()}))
    DatasetDict({'testdev': qs, 'images': ims}).save_to_disk(str(tmp_path/'gqa'))
    got = answer_view(load_benchmarks(f'gqa={tmp_path}/gqa', 'held_out', hub_reachable=False)['gqa'])
    by_id = {'n3': px(img(1)), 'n7': px(img(0))}   # the hand join: imageId → that image
    assert got == [(by_id[i], q, [a], SHORT_ANSWER_PROMPT) for i, q, a in zip(qs['imageId'], qs['question'], qs['answer'])]

def test_mmmu(tmp_path):
    feats = {'id': S(), 'question': S(), 'options': S(), 'explanation': S(), **{f'image_{k}': DImage() for k in range(1, 8)},
             'img_type': S(), 'answer': S(), 'topic_difficulty': S(), 'question_type': S(), 'subfield': S()}
    rows = [('Which organ? <image 1>', "['heart', 'lung', 'liver']", 'C', 'multiple-choice', [img(0)]),
            ('Compare <image 1> and <image 2>', "['x', 'y']", 'A', 'multiple-choice', [img(1), img(2)]),
            ('What is the ratio? <image 1>', '[]', "['0.5', '1/2']", 'open', [img(3)]),
            ('Value? <image 1>', '[]', '42', 'open', [img(4)])]
    data = {'id': [f'v_{i}' for i in range(4)], 'question': [r[0] for r in rows], 'options': [r[1] for r in rows], 'explanation': [''] * 4,
            **{f'image_{k}': [r[4][k - 1] if len(r[4]) >= k else None for r in rows] for k in range(1, 8)},
            'img_type': ['x'] * 4, 'answer': [r[2] for r in rows], 'topic_difficulty': ['easy'] * 4, 'question_type': [r[3] for r in rows], 'subfield': ['s'] * 4}
    def hand(q, opts, ans, kind, ims):   # the naive mapping, written out
        if len(ims) > 1: return None
        if kind == 'multiple-choice':
            return (px(ims[0]), q + ''.join(f'\n{"ABC"[i]}. {o}' for i, o in enumerate(ast.literal_eval(opts))), [ans], ANSWER_PROMPT)
        return (px(ims[0]), q, list(ast.literal_eval(ans)) if ans.startswith('[') else [ans], SHORT_ANSWER_PROMPT)
    want = [h for h in (hand(*r) for r in rows) if h is not None]
    assert answer_view(roundtrip(tmp_path, 'mmmu', data, feats)) == want

def test_sampling_and_bad_folders(tmp_path):
    feats = Features({'question': S(), 'options': DSeq(S()), 'answer': S(), 'image': DImage()})
    Dataset.from_dict({'question': [f'Q{i}' for i in range(10)], 'options': [['a', 'b']] * 10, 'answer': ['1'] * 10, 'image': [img(i) for i in range(10)]},
                      features=feats).save_to_disk(str(tmp_path/'ai2d'))
    a, b = (load_benchmark('ai2d', str(tmp_path/'ai2d'), n=4, seed=s) for s in (0, 0))
    assert [i.question for i in a] == [i.question for i in b] and len({i.question for i in a}) == 4   # seeded, without replacement
    assert [i.question for i in load_benchmark('ai2d', str(tmp_path/'ai2d'), n=4, seed=1)] != [i.question for i in a]
    assert [i.question for i in load_benchmark('ai2d', str(tmp_path/'ai2d'))] == [f'Q{i}' for i in range(10)]
    Dataset.from_dict({'question': ['Q'], 'image': [img(0)]}, features=Features({'question': S(), 'image': DImage()})).save_to_disk(str(tmp_path/'bare'))
    with pytest.raises(FusionError, match=r"ai2d at .*bare: lacks column\(s\) \['options', 'answer'\]"): load_benchmark('ai2d', str(tmp_path/'bare'))
    DatasetDict({'validation': Dataset.from_dict({'question': ['Q']})}).save_to_disk(str(tmp_path/'wrong_split'))
    with pytest.raises(FusionError, match="holds splits \\['validation'\\], not 'test'"): load_benchmark('ai2d', str(tmp_path/'wrong_split'))

def test_paper_profile_offline_names_every_set(tmp_path):
    "The llava-1.5-7b profile's own lists: offline with an empty cache, one error names all fifteen sets and the way out."
    P = load_profile('llava-1.5-7b')
    held_in, held_out, validation = P.extra['llava_held_in'], P.extra['llava_held_out'], P.extra['llava_validation']
    assert [s.split('=')[0] for s in held_in.split()] == ['mmbench', 'oodcv_vqa', 'scienceqa_img', 'seedbench', 'ai2d']
    assert held_out.split() == ['ok_vqa', 'textvqa', 'gqa', 'vizwiz_vqa', 'vqav2', 'pope', 'mmmu']
    assert validation.split() == ['realworldqa', 'seedbench2_plus', 'ocrbench']
    with pytest.raises(FusionError) as e: check_benchmarks(held_in, held_out, validation=validation, root=tmp_path, hub_reachable=False, what="profile 'llava-1.5-7b'")
    msg = str(e.value)
    assert msg.startswith("profile 'llava-1.5-7b': 15 evaluation set(s) cannot be loaded")
    for name in BENCHMARKS: assert f'\n  - {name}: ' in msg
    assert msg.count('is not in the local cache and the hub is not reachable') == 14 and "Kostumov et al.'s code" in msg

def test_experiment_40_paper_profile_fails_first_on_its_sets(tmp_path):
    "Experiment 40 on the paper profile, offline: the first error is the one naming all fifteen sets (before the model, device or fine-tunes)."
    import os, subprocess, sys
    from pathlib import Path
    repo = Path(__file__).resolve().parents[2]
    args = [*PAPERMILL, str(repo/'nbs'/'experiments'/'40_uq_merge.ipynb'), str(tmp_path/'run.ipynb'),
            '-k', 'python3', '-p', 'profile', 'llava-1.5-7b', '-p', 'output_dir', str(tmp_path/'out')]
    env = {**os.environ, 'FUSION_NB_ROOT': str(repo), 'HF_HUB_OFFLINE': '1', 'PYTHONPATH': str(repo), 'HF_DATASETS_CACHE': str(tmp_path/'empty_cache')}
    r = subprocess.run(args, env=env, capture_output=True, text=True, cwd=repo)
    assert r.returncode != 0
    assert "profile 'llava-1.5-7b' (llava_held_in / llava_held_out / llava_validation): 15 evaluation set(s) cannot be loaded" in r.stderr + r.stdout, r.stderr[-2000:]

def test_experiment_40_paper_branch_runs_on_local_sets(tmp_path):
    """Experiment 40's paper-scale branch end to end, offline: a profile like llava-1.5-7b (no build, sets by name) whose
    'fine-tunes' are three micro-zoo LLaVAs and whose sets are local folders in their hub copies' layouts. The tables get
    one column per listed set, and the held-in accuracy recorded for UQ-Merge's first step is the first model's own."""
    import os, subprocess, sys
    from pathlib import Path
    import pandas as pd
    from fusion_nb.llava.zoo import ZOO, llava_zoo
    from fusion_nb.llava.model import load_llava
    from fusion_nb.llava.uncertainty import answer_accuracy
    repo = Path(__file__).resolve().parents[2]
    P = load_profile('micro', settings=repo/'settings.ini')
    steps, examples = (list(map(int, P.extra[k].split())) for k in ('llava_zoo_steps', 'llava_zoo_examples'))
    recipe = dict(ZOO) | dict(zip(['pretrain_steps', 'general_steps', 'tune_steps'], steps)) | dict(zip(['n_captions', 'n_general', 'n_train'], examples))
    zoo, _ = llava_zoo(repo/'data'/'micro'/'llava', recipe, progress=False)
    sets = tmp_path/'sets'
    Dataset.from_dict({'index': [0, 1, 2], 'question': ['Q0?', 'Q1?', 'Q2?'], 'hint': ['nan'] * 3, 'A': ['cat', 'dog', 'cat'], 'B': ['dog', 'cat', 'frog'],
                       'C': [None] * 3, 'D': [None] * 3, 'answer': ['A', 'B', 'B'], 'image': [img(i) for i in range(3)]},
                      features=Features({'index': Value('int64'), **{k: S() for k in ['question', 'hint', 'A', 'B', 'C', 'D', 'answer']}, 'image': DImage()})
                      ).save_to_disk(str(sets/'mmbench'))
    Dataset.from_dict({'question': ['Which?'] * 3, 'options': [['a', 'b', 'c']] * 3, 'answer': ['0', '1', '2'], 'image': [img(i + 3) for i in range(3)]},
                      features=Features({'question': S(), 'options': DSeq(S()), 'answer': S(), 'image': DImage()})).save_to_disk(str(sets/'ai2d'))
    Dataset.from_dict({'question': ['Is there a cat in the image?', 'Is there a dog in the image?', 'Is there a frog in the image?'], 'answer': ['yes', 'no', 'no'],
                       'image': [img(i) for i in range(3)]}, features=Features({'question': S(), 'answer': S(), 'image': DImage()})).save_to_disk(str(sets/'pope'))
    Dataset.from_dict({'question': ['What is it?', 'What colour?', 'Shape?'], 'answers': [['cat'] * 3, ['red'] * 3, ['round'] * 3], 'image': [img(i) for i in range(3)]},
                      features=Features({'question': S(), 'answers': DSeq(S()), 'image': DImage()})).save_to_disk(str(sets/'textvqa'))
    Dataset.from_dict({'question': ['Which animal?\nA. cat\nB. dog', 'How many?', 'Colour?'], 'answer': ['A', '2', 'red'], 'image': [img(i + 6) for i in range(3)]},
                      features=Features({'question': S(), 'answer': S(), 'image': DImage()})).save_to_disk(str(sets/'realworldqa'))
    (tmp_path/'nbs').symlink_to(repo/'nbs')
    models = ['instruct', 'cifar10', 'captions_1']
    (tmp_path/'settings.ini').write_text((repo/'settings.ini').read_text() + f"""
[paper-mini]
description = experiment 40's paper branch on micro LLaVAs and local sets (test)
device = cpu
batch_size = 4
experiments = 40
pretrained = {zoo/'base'}
llava_finetunes = {' '.join(f'{m}={zoo/m}' for m in models)}
llava_held_in = mmbench=./sets/mmbench ai2d=./sets/ai2d
llava_held_out = pope=./sets/pope textvqa=./sets/textvqa
llava_validation = realworldqa=./sets/realworldqa
llava_passes = 2
""")
    args = [*PAPERMILL, str(repo/'nbs'/'experiments'/'40_uq_merge.ipynb'), str(tmp_path/'run.ipynb'), '-k', 'python3',
            '-p', 'profile', 'paper-mini', '-p', 'output_dir', str(tmp_path/'out'), '-p', 'methods', 'task_arithmetic', '-p', 'draws', '1',
            '-p', 'repeats', '1', '-y', 'perturbation_sets: ["image"]']
    env = {**os.environ, 'FUSION_NB_ROOT': str(tmp_path), 'HF_HUB_OFFLINE': '1', 'PYTHONPATH': str(repo)}
    r = subprocess.run(args, env=env, capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    t1 = pd.read_csv(tmp_path/'out'/'table1.csv', index_col=0)
    assert list(t1.columns) == ['avg_held_in', 'mmbench', 'ai2d', 'avg_held_out', 'pope', 'textvqa']
    assert list(pd.read_csv(tmp_path/'out'/'table10.csv', index_col=0).index) == ['realworldqa']   # the profile's validation set
    assert (tmp_path/'out'/'table4_authors.csv').exists() and (tmp_path/'out'/'table1_authors_mean.csv').exists()
    steps = pd.read_csv(tmp_path/'out'/'uq_merge_steps.csv')
    first = steps[(steps.run == 'uq_merge') & (steps.step == 1)].iloc[0]
    model, proc = load_llava(zoo/first.added)
    own = [100 * answer_accuracy(model, proc, load_benchmark(n, str(sets/n))) for n in ['mmbench', 'ai2d']]
    assert abs(first.avg_held_in - sum(own) / 2) < 1e-9
