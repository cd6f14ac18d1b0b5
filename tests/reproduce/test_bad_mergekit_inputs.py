"""Issue 51's mergekit-schema inputs: each a clear error naming the key, the model (its path) and what is allowed, or the
reading mergekit's own config gives it; on tiny random Llama/GPT-2 stand-ins; nothing written when refused."""
import pytest
import torch
import yaml
from safetensors.torch import load_file

from fusion_nb.core import FusionError, IncompatibleModelsError
from fusion_nb.reproduce.merge_config import load_merge_config, run_merge
from test_hf_merge import _close, _gpt2, _llama, _save, _zoo   # the tiny stand-ins of the Hugging Face merge tests

@pytest.fixture(scope='module')
def zoo(tmp_path_factory):
    tmp = tmp_path_factory.mktemp('zoo')
    return _zoo(tmp, _llama)

def _cfg(zoo, method='linear', models=None, **kw):
    (b, e1, e2), _ = zoo
    models = models or [dict(model=str(e1), parameters=dict(weight=1.0)), dict(model=str(e2), parameters=dict(weight=1.0))]
    return dict(merge_method=method, models=models, **({'base_model': str(b)} if method != 'linear' else {}), **kw)

def _refused(cfg, tmp_path, error=FusionError, match=''):
    "run_merge refuses `cfg` with `match` in the message and writes nothing."
    with pytest.raises(error, match=match): run_merge(cfg, tmp_path/'out', progress=False, log=lambda s: None)
    assert not (tmp_path/'out').exists()

@pytest.mark.parametrize('flag', ['no', 'false', 'False', 'off'])
def test_quoted_no_for_normalize_is_false(zoo, tmp_path, flag):
    "item 3: `normalize: \"no\"` was merged as true (bool of a text); read as pydantic reads a bool, as mergekit's config does."
    (b, e1, e2), (B, E1, E2) = zoo
    out = run_merge(_cfg(zoo, parameters={'normalize': flag}), tmp_path/'out', progress=False, log=lambda s: None)
    merged = load_file(out/'model.safetensors') if (out/'model.safetensors').exists() else {
        k: v for f in out.glob('*.safetensors') for k, v in load_file(f).items()}
    for k in ['model.layers.0.mlp.up_proj.weight', 'lm_head.weight']: _close(merged[k], E1[k] + E2[k])

def test_not_true_or_false_is_refused(zoo, tmp_path):
    _refused(_cfg(zoo, parameters={'normalize': 'sometimes'}), tmp_path, match=r"parameters\.normalize: 'sometimes' is not true or false")

def _llama4():
    from transformers import LlamaConfig, LlamaForCausalLM
    return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=4, num_attention_heads=2,
                                        num_key_value_heads=2, max_position_embeddings=32, tie_word_embeddings=False))

def test_deeper_expert_is_refused(zoo, tmp_path):
    "item 7: a 4-layer expert beside a 3-layer base silently lost its fourth layer; mergekit 0.1.5 refuses it."
    (b, e1, e2), _ = zoo
    _save(_llama4(), tmp_path/'deep')
    cfg = _cfg(zoo, 'task_arithmetic', models=[dict(model=str(e1), parameters=dict(weight=1.0)),
                                               dict(model=str(tmp_path/'deep'), parameters=dict(weight=1.0))])
    _refused(cfg, tmp_path, IncompatibleModelsError, match=r"deep.*the base \(.*base\) lacks, e\.g\. 'model\.layers\.3\.")

def test_duplicate_keys_refused(zoo, tmp_path):
    "item 8: a key given twice kept the last silently (dtype, method); refused naming the key and both lines."
    text = yaml.safe_dump(_cfg(zoo), sort_keys=False) + "dtype: float16\ndtype: bfloat16\n"
    (tmp_path/'c.yml').write_text(text)
    with pytest.raises(FusionError, match=r"c\.yml: not valid YAML \(line \d+, column 1\): key 'dtype' is given twice \(lines \d+ and \d+\)"):
        load_merge_config(tmp_path/'c.yml')
    (tmp_path/'own.yml').write_text("method: ties_merging\nmethod: task_arithmetic\nmodels: [a]\n")
    with pytest.raises(FusionError, match=r"key 'method' is given twice \(lines 1 and 2\)"): load_merge_config(tmp_path/'own.yml')

def test_nuslerp_weights_summing_to_zero(zoo, tmp_path):
    "item 9: nuslerp with weights 0 and 0 merged near the midpoint; mergekit divides by their sum."
    (b, e1, e2), _ = zoo
    cfg = _cfg(zoo, 'nuslerp', models=[dict(model=str(e1), parameters=dict(weight=0)), dict(model=str(e2), parameters=dict(weight=0))])
    del cfg['base_model']
    _refused(cfg, tmp_path, match=r"weight: mergekit's nuslerp divides by the weights' sum.*sum to 0 \(models\[0\] \(.*e1\): 0, models\[1\]")

@pytest.mark.parametrize('param, value, message', [
    ('weight', 'abc', r"models\[1\] \(.*e2\)\.parameters\.weight: 'abc' is not a number"),
    ('density', '50%', r"models\[1\] \(.*e2\)\.parameters\.density: '50%' is not a number \(write 0\.5 for 50%\)"),
    ('density', 0.0, r"models\[1\] \(.*e2\)\.parameters\.density: 0 is out of range: density is the fraction of entries kept, in \(0, 1\]"),
    ('weight', float('nan'), r"models\[1\] \(.*e2\)\.parameters\.weight: nan is not a finite number")])
def test_bad_values_named_in_mergekit_words(zoo, tmp_path, param, value, message):
    "items 10 and 12: raw ValueError, or this project's names (p=1.0, scaling_factor[0]); now mergekit's key and the model's path."
    (b, e1, e2), _ = zoo
    cfg = _cfg(zoo, 'dare_ties', models=[dict(model=str(e1), parameters=dict(weight=1.0, density=0.5)),
                                         dict(model=str(e2), parameters={'weight': 1.0, 'density': 0.5, param: value})])
    _refused(cfg, tmp_path, match=message)

def test_gpt2_beside_llama_names_the_architectures(zoo, tmp_path):
    "item 14: 'model \"e1'\" has no tensor …' became: which model, its path, its architecture and the base's."
    (b, e1, e2), _ = zoo
    _save(_gpt2(), tmp_path/'gpt')
    cfg = _cfg(zoo, 'task_arithmetic', models=[dict(model=str(e1), parameters=dict(weight=1.0)),
                                               dict(model=str(tmp_path/'gpt'), parameters=dict(weight=1.0))])
    _refused(cfg, tmp_path, IncompatibleModelsError, match=r"models\[1\] \(.*gpt\) is a 'gpt2' model, base_model \(.*base\) a 'llama': another architecture")
    own = dict(method='task_arithmetic', base_model=str(b), models=[str(e1), str(tmp_path/'gpt')])
    _refused(own, tmp_path, IncompatibleModelsError, match=r"models\[1\] \(gpt\) \(.*gpt\) is a 'gpt2' model")

@pytest.mark.parametrize('schema', ['mergekit', 'own'])
def test_empty_models_list(zoo, tmp_path, schema):
    "item 15: `models: []` said 'expected a list'; it is a list, and empty."
    cfg = _cfg(zoo) if schema == 'mergekit' else dict(method='task_arithmetic', base_model=str(zoo[0][0]))
    cfg['models'] = []
    _refused(cfg, tmp_path, match='models: the list is empty')

def test_nan_lambda_names_the_parameter(zoo, tmp_path):
    "issue 51 item 13, mergekit's ties: `lambda: .nan` said 'parameter value(s) [nan] are not finite' without naming it (now refused as read)."
    _refused(_cfg(zoo, 'ties', parameters={'lambda': float('nan')}), tmp_path, match=r"parameters\.lambda: nan is not a finite number")

def test_rerun_keeps_the_card_the_user_edited(zoo, tmp_path):
    "issue 51 item 2, mergekit's schema: a rerun into an earlier export replaced the README.md the user had edited."
    notes = []
    out = run_merge(_cfg(zoo), tmp_path/'out', progress=False, log=notes.append)
    edited = (out/'README.md').read_text() + '\nMy notes on this merge.\n'
    (out/'README.md').write_text(edited)
    run_merge(_cfg(zoo), tmp_path/'out', progress=False, log=notes.append)
    assert (out/'README.md').read_text() == edited and (out/'README.fusion_nb.md').exists()
    assert any('README' in n for n in notes), notes
