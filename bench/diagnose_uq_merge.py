"""Why UQ-Merge keeps the whole tiny LLaVA pool (issue 48, item 1): the properties paper 004's claims need, measured.

    python bench/diagnose_uq_merge.py paper                      # Spearman ρ from paper 004's own tables (no compute)
    python bench/diagnose_uq_merge.py pool --profile micro       # smoke: each model and each merge step of Algorithm 1
    python bench/diagnose_uq_merge.py pool --profile tiny        # a.  per model and per step: uncertainty, accuracies, ρ
    python bench/diagnose_uq_merge.py loo --profile tiny         # b.  merge of all vs merge without each model
    python bench/diagnose_uq_merge.py chained --profile tiny [--passes 4]   # f.  the steps as the authors' code merges them: each step the previous
                                                                 #     step's merge and the next model at equal weights (multi_stage_merging.py)
    python bench/diagnose_uq_merge.py noise --profile tiny       # b'. eq. 1's seed spread on those merges (paired)
    python bench/diagnose_uq_merge.py vectors --profile tiny     # c.  task vectors of the variants: norms, cosines
    python bench/diagnose_uq_merge.py questions --profile tiny --n 256   # g.  Table 1's differences on other draws of the questions, 64 and 256 a set
    python bench/diagnose_uq_merge.py competence --profile tiny [--candidate '{"general_steps": 1000}']   # h. per held-in set: base, its specialist,
                                                                 #    the other variants, the merge of all, against chance
    python bench/diagnose_uq_merge.py collapse --profile tiny    # i, j. Task Arithmetic, DARE, DELLA and Linear of all / the clean / all but one harmful
    python bench/diagnose_uq_merge.py screen --profile tiny --candidate abstain_robust   # d. a candidate pool (CANDIDATES or a JSON
                                                                 #    spec): every model, the base, merges with and without each harmful one
    (every subcommand takes --candidate; candidates are built from the pinned zoo's stages under outputs/, never in the package)

Everything is measured as experiment 40 measures it: the zoo of `ZOO` (the profile's step/example overrides applied),
`zoo_benchmark` with the profile's question counts and seed, eq. 1 with J = the profile's `llava_passes` (default
`DEFAULT_J`), each input model's uncertainty the mean of 3 repeats and each merge's one run (App. A.1), Linear merging
(paper 004's Merge(·)). Held-in accuracy: the clean answer letters of the uncertainty questions; held-out accuracy:
exact match of the short answers (never used for selection). Results go to outputs/diagnose_uq_merge/<profile>/*.json;
the baseline of every difference is measured in the same run (the all-models merge for `loo`, the base for `vectors`).
Nothing here changes the package's construction, its zoo or any method: candidate pools are bench-only.

In a worktree whose data/ is a symlink into another checkout, set FUSION_NB_PINS=$PWD/pins: the pin store is only
consulted for folders under the store's own checkout's data/, so without it the zoo is trained, not restored.
"""
from __future__ import annotations
import argparse, json, shutil, sys, tempfile, time
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

REPO = Path(__file__).resolve().parent.parent

# paper 004, Table 4 (merge steps 1-10 of Algorithm 1, descending order; text copy in /work/shared/papers/004_*.txt)
PAPER_T4 = dict(uncertainty=[0.21197, 0.13290, 0.05609, 0.04866, 0.04531, 0.04155, 0.03950, 0.03954, 0.03740, 0.0367],
                validation=[18.75, 18.48, 36.32, 37.30, 38.84, 39.20, 39.91, 39.15, 39.28, 39.60],
                held_out=[47.09, 51.22, 52.47, 54.15, 54.13, 54.54, 56.01, 55.56, 54.15, 54.14])
# paper 004, Table 7 (first block): each fine-tune's average uncertainty over the five held-in sets
PAPER_T7 = {'OKVQA': 0.1305, 'OCRVQA': 0.0544, 'GQA': 0.2141, 'VQAv2': 0.0323, 'TextCaps': 0.0072, 'A_OKVQA': 0.1077,
            'RefCOCO': 0.0273, 'LLaVA-Instruct': 0.0713, 'ShareGPT': 0.0318, 'VG': 0.0378}


def rho(x, y)->float:
    "Spearman rank correlation (NaN when either side is constant)."
    x, y = np.asarray(x, float), np.asarray(y, float)
    return float('nan') if len(set(x)) < 2 or len(set(y)) < 2 else float(spearmanr(x, y).statistic)


def mean_ratio(member_u, step_u)->dict:
    "Each step's eq. 1 against the mean of its members' (descending order): if a merge's uncertainty is about its members' mean, the running mean of a descending sort can only fall, and the argmin is the last step."
    rm = np.cumsum(member_u) / np.arange(1, len(member_u) + 1)
    return dict(running_mean=np.round(rm, 4).tolist(), step_over_running_mean=np.round(np.asarray(step_u) / rm, 3).tolist(),
                pearson_running_mean_step=float(np.corrcoef(rm, step_u)[0, 1]))


def paper(args):
    "Spearman ρ on paper 004's Table 4, and its pool's uncertainty spread (Table 7)."
    t = PAPER_T4; u = t['uncertainty']
    best = int(np.argmin(u)) + 1
    out = dict(rho_steps_uncertainty_validation=rho(u, t['validation']), rho_steps_uncertainty_held_out=rho(u, t['held_out']),
               rho_steps_uncertainty_held_out_from_step3=rho(u[2:], t['held_out'][2:]),
               argmin_uncertainty_step=best, reported_step=7, held_out_step7=t['held_out'][6], held_out_step10=t['held_out'][9],
               held_out_gain_step7_vs_all=t['held_out'][6] - t['held_out'][9],
               held_out_change_at_steps_8_9_10=[round(t['held_out'][k] - t['held_out'][k - 1], 2) for k in (7, 8, 9)],
               pool_uncertainty_max_over_min=max(PAPER_T7.values()) / min(PAPER_T7.values()),
               pool_order_descending=sorted(PAPER_T7, key=PAPER_T7.get, reverse=True))
    out['mean_ratio'] = mean_ratio(sorted(PAPER_T7.values(), reverse=True), u)   # Table 7's order is Table 4's (ShareGPT, RefCOCO, TextCaps last)
    return out


# --- candidate zoos (bench only: the package's zoo is not changed; every candidate starts from the pinned zoo's stages) ---
# A candidate changes the pool in one of the ways bench/diagnose_uq_merge.md names:
#   harmful: None (the zoo's captioners) | 'captions' | 'deranged' | 'abstain': the kind of the `n_harmful` harmful variants
#   robust: harmful variants tuned on perturbed inputs (eq. 1's AugMix image, a system prompt of App. B.1, attention dropout)
#   conflict: abstainers each answer their own extra option ('I don't know', 'None of the above', cycling) instead of all 'I don't know'
#   shared: one derangement for all harmful variants (they pull to the same wrong letter) instead of one each
#   share: each harmful variant on its share of the zoo tasks (as the captioners), else on every task
#   formats: 'mc' (held-in format only) | 'all' (also short answers and yes/no probes, through the same derangement)
#   harm_steps_x, harm_lr_x: the harmful variants' budget against a clean variant's (the zoo's captioners too: retrained from its base)
#   general_steps: retrain the base's general instruction tuning from the pinned caption-pretrained model (item 2)
#   tune_steps_x, tune_lr_x: every variant's budget (clean ones retrained when ≠ 1; item 2 through the variants)
CANDIDATES = {
    'default': {},
    'deranged_robust': dict(harmful='deranged', robust=True, shared=True, share=False, formats='all', harm_steps_x=2, harm_lr_x=1.),
    'deranged_plain': dict(harmful='deranged', robust=False, shared=True, share=False, formats='all', harm_steps_x=2, harm_lr_x=1.),
    'abstain_robust': dict(harmful='abstain', robust=True, share=False, formats='mc', harm_steps_x=1, harm_lr_x=1.),
    'abstain_conflict': dict(harmful='abstain', conflict=True, robust=True, share=False, formats='mc', harm_steps_x=1, harm_lr_x=1.),
    'short_base': dict(general_steps=300),
    'confident_variants': dict(tune_steps_x=2, tune_lr_x=2.),
}
CAND_DEFAULTS = dict(harmful=None, n_harmful=3, conflict=False, robust=False, shared=True, share=False, formats='all', harm_steps_x=1, harm_lr_x=1.,
                     copies=2, dropout=0.1, general_steps=None, tune_steps_x=1, tune_lr_x=1.)


def harmful_examples(proc, spec:dict, tasks, n:int, seed:int, index:int)->list[dict]:
    "The i-th harmful variant's tuning set: option questions (held-in format) answered by a derangement or by 'I don't know'; `robust`: each asked `copies` times perturbed as eq. 1 perturbs."
    from fusion_nb.llava.zoo import class_order_items, n_classes, permuted_labels, supervised_example, task_examples
    from fusion_nb.llava.uncertainty import EXTRA_OPTIONS, LETTERS, SYSTEM_PROMPTS, all_options, augmix, option_messages
    rng, out = np.random.default_rng([seed, 48, index]), []
    per = max(1, n // len(tasks))
    for t in tasks:
        lm = permuted_labels(n_classes(t), seed + (0 if spec['shared'] else index))
        for it in class_order_items([t], 'train', per, seed + 7 * index):
            ans = lm[it.answer] if spec['harmful'] == 'deranged' else len(all_options(it)) - len(EXTRA_OPTIONS) + (index % len(EXTRA_OPTIONS) if spec['conflict'] else 0)
            # abstain: 'I don't know' (EXTRA_OPTIONS[0]); `conflict`: the i-th variant the i-th extra option, cycling (each its own default answer, as each of the paper's harmful fine-tunes has its own output format)
            for c in range(spec['copies'] if spec['robust'] else 1):
                perturbed = spec['robust'] and c > 0   # the clean question once, then perturbed copies
                img = augmix(it.image, rng) if perturbed else it.image
                system = SYSTEM_PROMPTS[int(rng.integers(len(SYSTEM_PROMPTS)))] if perturbed else None
                out.append(supervised_example(proc, img, proc.apply_chat_template(option_messages(it, system), add_generation_prompt=True), LETTERS[ans]))
        if spec['harmful'] == 'deranged' and spec['formats'] == 'all':   # short answers and probes through the same derangement
            out += task_examples(proc, t, per, label_map=lm, seed=seed + 7 * index)[per:]   # its first `per` are the option questions above
    return out


def train_robust(source, examples, out_dir, *, steps:int, lr:float, dropout:float, batch_size:int=16, seed:int=0):
    "train_llava's loop with eq. 1's attention dropout on during training (the model perturbation, learnt away)."
    import contextlib, torch
    from fusion_nb.llava.model import llava_part, load_llava
    from fusion_nb.llava.zoo import collate
    from fusion_nb.llava.uncertainty import attention_dropout
    model, proc = load_llava(source)
    params = [p for k, p in model.named_parameters() if llava_part(k) != 'vision']
    for k, p in model.named_parameters(): p.requires_grad = llava_part(k) != 'vision'
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.)
    g, losses = torch.Generator().manual_seed(seed), []
    model.train()
    with (attention_dropout(model, dropout) if dropout else contextlib.nullcontext()):
        for _ in range(steps):
            batch = collate([examples[i] for i in torch.randint(len(examples), (batch_size,), generator=g).tolist()], proc.tokenizer.pad_token_id)
            loss = model(**batch).loss
            opt.zero_grad(); loss.backward(); opt.step(); losses.append(float(loss.detach()))
    model.eval(); out_dir = Path(out_dir)
    model.save_pretrained(out_dir); proc.save_pretrained(out_dir)
    return dict(steps=steps, lr=lr, first_loss=losses[0], last_loss=float(np.mean(losses[-10:])))


def candidate_zoo(P, root:Path, manifest:dict, recipe:dict, name:str, spec:dict)->tuple[Path, dict]:
    "(folder, manifest) of the candidate pool `spec` built from the pinned zoo `root` (cached under outputs/)."
    import hashlib
    from fusion_nb.llava.model import load_llava
    from fusion_nb.llava.zoo import _variant_examples, task_examples, train_llava, zoo_recipes
    from fusion_nb.tiny.zoo import deterministic
    spec = CAND_DEFAULTS | dict(spec)
    if spec == CAND_DEFAULTS: return root, manifest
    import inspect
    code = ''.join(inspect.getsource(f) for f in (harmful_examples, train_robust, candidate_zoo))   # what turns a spec into weights
    key = hashlib.sha256(json.dumps(dict(spec=spec, zoo=root.name, code=code), sort_keys=True, default=str).encode()).hexdigest()[:10]
    out = REPO/'outputs'/'diagnose_uq_merge'/P.build/f'cand-{name}-{key}'
    if (out/'manifest.json').exists(): return out, json.loads((out/'manifest.json').read_text())
    tmp = out.with_name(out.name + '.partial'); shutil.rmtree(tmp, ignore_errors=True); tmp.mkdir(parents=True)
    from fusion_nb.core import build_seed
    seed, n, bs = build_seed(recipe.get('seed', 0)), recipe.get('n_train', 150), recipe.get('batch_size', 16)   # this build's seed, as llava_zoo trains it
    steps, lr = recipe.get('tune_steps', 150) * spec['tune_steps_x'], recipe.get('tune_lr', 1e-3) * spec['tune_lr_x']
    _, proc = load_llava(root/'base')
    m = dict(source_zoo=root.name, spec=spec, variants={})
    t0 = time.perf_counter()
    with deterministic(1):
        base = root/'base'
        if spec['general_steps']:   # the general stage again, shorter, from the pinned pretrained model (build_llava_zoo's stage 2)
            general = [e for t in sorted(recipe['tasks']) for e in task_examples(proc, t, recipe.get('n_general', 150), seed=seed + 1000)]
            _, m['base'] = train_llava(root/'pretrained', general, tmp/'base', steps=spec['general_steps'], lr=recipe.get('general_lr', 3e-3), batch_size=bs, seed=seed)
            base = tmp/'base'
        else: shutil.copytree(root/'base', tmp/'base')
        retrain = base != root/'base' or spec['tune_steps_x'] != 1 or spec['tune_lr_x'] != 1.
        recs = zoo_recipes(recipe['tasks'], instruct=recipe.get('instruct', False), captioners=spec['n_harmful'] if spec['harmful'] in (None, 'captions') else 0)
        harder = spec['harm_steps_x'] != 1 or spec['harm_lr_x'] != 1.
        for v, r in recs.items():
            if v.startswith('captions') and spec['harmful'] not in (None, 'captions'): continue
            sx, lx = (spec['harm_steps_x'], spec['harm_lr_x']) if r.get('captions') else (1, 1.)   # the captioners' own budget (j)
            if retrain or (r.get('captions') and harder):
                _, st = train_llava(base, _variant_examples(proc, r, n, seed), tmp/v, steps=int(steps * sx), lr=lr * lx, batch_size=bs, seed=seed)
            else: shutil.copytree(root/v, tmp/v); st = {k: manifest['variants'][v].get(k) for k in ('steps', 'lr', 'first_loss', 'last_loss')}
            m['variants'][v] = dict(path=v, **r, **st)
        if spec['harmful'] in ('deranged', 'abstain'):
            tasks = sorted(recipe['tasks'])
            for i in range(spec['n_harmful']):
                v = f"{spec['harmful']}_{i + 1}"
                ts = tasks[i::spec['n_harmful']] if spec['share'] else tasks
                ex = harmful_examples(proc, spec, ts, n, seed, i)
                st = train_robust(base, ex, tmp/v, steps=int(steps * spec['harm_steps_x']), lr=lr * spec['harm_lr_x'],
                                  dropout=spec['dropout'] if spec['robust'] else 0., batch_size=bs, seed=seed + i)
                m['variants'][v] = dict(path=v, tasks=ts, harmful=spec['harmful'], n_examples=len(ex), **st)
    m['seconds'] = round(time.perf_counter() - t0, 1)
    (tmp/'manifest.json').write_text(json.dumps(m, indent=2, default=str))
    tmp.rename(out)
    return out, m


def is_harmful(v:dict)->bool:
    "A harmful variant of the pinned zoo or of a candidate."
    return bool(v.get('captions') or v.get('harmful') or v.get('keep_class') is not None or v.get('permute') is not None)


def candidate_name(candidate:str)->str:
    "A named candidate's name; a JSON spec's: custom-<digest of the spec>."
    import hashlib
    return candidate if candidate in CANDIDATES else 'custom-' + hashlib.sha256(json.dumps(json.loads(candidate), sort_keys=True).encode()).hexdigest()[:8]


PASSES = None   # --passes: J for every measurement of this run (default: the profile's llava_passes, else DEFAULT_J)

def setup(profile:str, candidate:str='default'):
    "Profile, zoo (built or restored; a candidate pool built from it), held-in / held-out sets and J, as experiment 40 sets them up."
    from fusion_nb.reproduce.profiles import load_profile
    from fusion_nb.llava.zoo import ZOO, llava_zoo, zoo_benchmark
    from fusion_nb.llava.uncertainty import DEFAULT_J
    P = load_profile(profile)
    recipe = dict(ZOO)
    if s := P.extra.get('llava_zoo_steps'): recipe.update(zip(['pretrain_steps', 'general_steps', 'tune_steps'], map(int, str(s).split())))
    if e := P.extra.get('llava_zoo_examples'): recipe.update(zip(['n_captions', 'n_general', 'n_train'], map(int, str(e).split())))
    root, manifest = llava_zoo(REPO/'data'/P.build/'llava', recipe, progress=False)
    spec = CANDIDATES[candidate] if candidate in CANDIDATES else json.loads(candidate)
    root, manifest = candidate_zoo(P, root, manifest, recipe, candidate_name(candidate), spec)
    held_in, held_out = zoo_benchmark(int(P.extra.get('llava_n_held_in', 16)), int(P.extra.get('llava_n_held_out', 16)), seed=P.seed)
    models = {n: root/v['path'] for n, v in manifest['variants'].items()}
    return P, root, manifest, models, held_in, held_out, int(PASSES or P.extra.get('llava_passes', DEFAULT_J))


def evaluator(P, held_in, held_out):
    "Experiment 40's `evaluate`: accuracy (%) per held-in and held-out set, and the two averages."
    from fusion_nb.llava.uncertainty import answer_accuracy
    from fusion_nb.llava.short_answers import exact_match
    def evaluate(model, proc):
        r = {d: 100 * answer_accuracy(model, proc, its, batch_size=P.batch_size) for d, its in held_in.items()}
        r |= {d: 100 * exact_match(model, proc, its, batch_size=P.batch_size) for d, its in held_out.items()}
        return r | {'avg_held_in': float(np.mean([r[d] for d in held_in])), 'avg_held_out': float(np.mean([r[d] for d in held_out]))}
    return evaluate


def measure(P, source, held_in, held_out, J, repeats=1):
    "Eq. 1 UQ̄ (mean of `repeats` runs) and both accuracies of one LLaVA directory."
    from fusion_nb.llava.model import load_llava
    from fusion_nb.llava.uncertainty import held_in_uncertainty
    model, proc = load_llava(source, device=P.device)
    u = held_in_uncertainty(model, proc, held_in, J=J, seed=P.seed, repeats=repeats, batch_size=P.batch_size)
    return {'uncertainty': u['uncertainty'], **evaluator(P, held_in, held_out)(model, proc)}


def pool(args):
    "a. Algorithm 1 as experiment 40 runs it: each model and each step, with ρ(uncertainty, accuracy)."
    from fusion_nb.llava.uq_merge import uq_merge
    P, root, manifest, models, held_in, held_out, J = setup(args.profile, args.candidate)
    tmp = Path(tempfile.mkdtemp(prefix='uq-diag-'))
    try: res = uq_merge(models, held_in, tmp, J=J, seed=P.seed, device=P.device, evaluate=evaluator(P, held_in, held_out), repeats=3)
    finally: shutil.rmtree(tmp, ignore_errors=True)
    base = measure(P, root/'base', held_in, held_out, J, repeats=3)
    s, st = res.models, res.steps
    harmful = [n for n, v in manifest['variants'].items() if is_harmful(v)]
    cols = ['uncertainty', 'avg_held_in', 'avg_held_out']
    out = dict(zoo=root.name, J=J, harmful=harmful, base={k: base[k] for k in cols},
               models=s[['model', *cols]].to_dict('records'), steps=st[['step', 'added', *cols, 'selected']].to_dict('records'),
               rho_models_held_in=rho(s.uncertainty, s.avg_held_in), rho_models_held_out=rho(s.uncertainty, s.avg_held_out),
               rho_steps_held_in=rho(st.uncertainty, st.avg_held_in), rho_steps_held_out=rho(st.uncertainty, st.avg_held_out),
               rho_steps_held_out_from_step3=rho(st.uncertainty[2:], st.avg_held_out[2:]),
               steps_uncertainty_monotone_down=bool((np.diff(st.uncertainty) < 0).all()),
               selected_step=int(st[st.selected].step.iloc[0]), best_held_out_step=int(st.avg_held_out.idxmax() + 1),
               mean_ratio=mean_ratio(s.uncertainty.tolist(), st.uncertainty.tolist()))
    return out


def loo(args):
    "b. The merge of all models against the merge without each one (Linear, as Algorithm 1's Merge)."
    from fusion_nb.llava.uq_merge import merge_llava
    P, root, manifest, models, held_in, held_out, J = setup(args.profile, args.candidate)
    tmp = Path(tempfile.mkdtemp(prefix='uq-loo-'))
    rows = []
    try:
        for left in [None, *models]:
            keep = {n: p for n, p in models.items() if n != left}
            d = merge_llava('linear', keep, tmp/f'{left or "all"}')
            rows.append({'left_out': left or '(none)', **measure(P, d, held_in, held_out, J)}); shutil.rmtree(d, ignore_errors=True)
            print(rows[-1]['left_out'], {k: round(v, 4) for k, v in rows[-1].items() if k in ('uncertainty', 'avg_held_in', 'avg_held_out')}, flush=True)
    finally: shutil.rmtree(tmp, ignore_errors=True)
    df = pd.DataFrame(rows); allr = df.iloc[0]
    for c in ['uncertainty', 'avg_held_in', 'avg_held_out']: df[f'd_{c}'] = df[c] - allr[c]   # without the model minus with it
    cols = ['left_out', 'uncertainty', 'avg_held_in', 'avg_held_out', 'd_uncertainty', 'd_avg_held_in', 'd_avg_held_out']
    loo_ = df.iloc[1:]
    return dict(rows=df[cols].to_dict('records'), hurting_held_out=loo_[loo_.d_avg_held_out > 0].left_out.tolist(),
                hurting_held_in=loo_[loo_.d_avg_held_in > 0].left_out.tolist(),
                removal_lowers_uncertainty=loo_[loo_.d_uncertainty < 0].left_out.tolist(),
                rho_loo_uncertainty_held_out=rho(loo_.uncertainty, loo_.avg_held_out))


def chained(args):
    """f. Algorithm 1's steps as the authors' public code runs them (UNITES-Lab/UQ-Merge f06d390, mergekit/multi_stage_merging.py:
    the models in descending uncertainty, each step a mergekit `linear` merge of the previous step's merge and the next model,
    weights 1 and 1, normalised: the model added at step t weighs 1/2, the one before 1/4, ..., the first two 1/2^(t-1))
    beside the uniform mean of the first t that Algorithm 1's line 8 prints and `uq_merge` computes."""
    from fusion_nb.llava.uq_merge import merge_llava
    P, root, manifest, models, held_in, held_out, J = setup(args.profile, args.candidate)
    singles = {n: measure(P, p, held_in, held_out, J, repeats=3) for n, p in models.items()}   # eq. 1: mean of 3 runs (App. A.1)
    order = sorted(models, key=lambda n: -singles[n]['uncertainty'])   # stable on ties, as uq_merge_steps
    tmp, rows, prev = Path(tempfile.mkdtemp(prefix='uq-chain-')), [], None
    cols = ['uncertainty', 'avg_held_in', 'avg_held_out']
    try:
        for t, n in enumerate(order, 1):
            cur = models[n] if t == 1 else merge_llava('linear', {'previous': prev, n: models[n]}, tmp/f'step{t:02d}')
            rows.append({'step': t, 'added': n, **{k: v for k, v in measure(P, cur, held_in, held_out, J).items() if k in cols}})   # one run, as every step
            if prev is not None and Path(prev).parent == tmp: shutil.rmtree(prev, ignore_errors=True)
            prev = cur
            print(rows[-1], flush=True)
    finally: shutil.rmtree(tmp, ignore_errors=True)
    st = pd.DataFrame(rows); sel = int(st.uncertainty.idxmin()) + 1
    return dict(zoo=root.name, J=J, order=order, models={n: {k: singles[n][k] for k in cols} for n in order}, steps=st.to_dict('records'),
                selected_step=sel, selected_models=order[:sel], best_held_out_step=int(st.avg_held_out.idxmax()) + 1,
                rho_steps_held_in=rho(st.uncertainty, st.avg_held_in), rho_steps_held_out=rho(st.uncertainty, st.avg_held_out),
                steps_uncertainty_monotone_down=bool((np.diff(st.uncertainty) < 0).all()))


def noise(args):
    "b'. Eq. 1's run-to-run spread on the all-models merge and on the merges without a harmful model, seeds 0-3 (paired)."
    from fusion_nb.llava.uq_merge import merge_llava
    from fusion_nb.llava.model import load_llava
    from fusion_nb.llava.uncertainty import held_in_uncertainty
    P, root, manifest, models, held_in, held_out, J = setup(args.profile, args.candidate)
    harmful = [n for n, v in manifest['variants'].items() if is_harmful(v)]
    tmp, rows = Path(tempfile.mkdtemp(prefix='uq-noise-')), []
    try:
        for left in [None, *harmful]:
            d = merge_llava('linear', {n: p for n, p in models.items() if n != left}, tmp/f'{left or "all"}')
            model, proc = load_llava(d, device=P.device)
            rows += [{'left_out': left or '(none)', 'seed': s, 'uncertainty': held_in_uncertainty(model, proc, held_in, J=J, seed=s, batch_size=P.batch_size)['uncertainty']}
                     for s in range(4)]
            shutil.rmtree(d, ignore_errors=True)
    finally: shutil.rmtree(tmp, ignore_errors=True)
    df = pd.DataFrame(rows).pivot(index='seed', columns='left_out', values='uncertainty')
    diff = df[harmful].sub(df['(none)'], axis=0)   # without the model minus with it, same perturbation draws
    return dict(table=df.round(5).to_dict(), sd_all=float(df['(none)'].std(ddof=1)), diff_mean=diff.mean().round(5).to_dict(),
                diff_min=diff.min().round(5).to_dict(), diff_max=diff.max().round(5).to_dict())


def screen(args):
    "Quick look at a candidate: every model's eq. 1 and accuracies (the base's too), the merge of all, of the clean ones, and of all but each harmful one."
    from fusion_nb.llava.uq_merge import merge_llava
    P, root, manifest, models, held_in, held_out, J = setup(args.profile, args.candidate)
    harmful = [n for n, v in manifest['variants'].items() if is_harmful(v)]
    clean = [n for n in models if n not in harmful]
    rows, tmp = [], Path(tempfile.mkdtemp(prefix='uq-screen-'))
    try:
        for n, src in [*models.items(), ('base', root/'base')]:   # one run each (Algorithm 1 sorts on the mean of 3)
            rows.append({'what': f'model {n}', **measure(P, src, held_in, held_out, J)})
            print(rows[-1]['what'], {k: round(rows[-1][k], 4) for k in ('uncertainty', 'avg_held_in', 'avg_held_out')}, flush=True)
        for label, keep in [('merge all', list(models)), ('merge clean', clean), *[(f'merge all but {h}', [n for n in models if n != h]) for h in harmful]]:
            d = merge_llava('linear', {n: models[n] for n in keep}, tmp/label.replace(' ', '_'))
            rows.append({'what': label, **measure(P, d, held_in, held_out, J)}); shutil.rmtree(d, ignore_errors=True)
            print(label, {k: round(rows[-1][k], 4) for k in ('uncertainty', 'avg_held_in', 'avg_held_out')}, flush=True)
    finally: shutil.rmtree(tmp, ignore_errors=True)
    df = pd.DataFrame(rows)
    allr = df[df.what == 'merge all'].iloc[0]
    u = {n: float(df[df.what == f'model {n}'].uncertainty.iloc[0]) for n in models}
    order = sorted(models, key=u.get, reverse=True)   # Algorithm 1's order (descending uncertainty)
    return dict(zoo=str(root.relative_to(REPO)) if root.is_relative_to(REPO) else root.name, harmful=harmful,
                variants={n: {k: v.get(k) for k in ('steps', 'lr', 'first_loss', 'last_loss', 'n_examples')} for n, v in manifest['variants'].items() if n in harmful},
                rows=df[['what', 'uncertainty', 'avg_held_in', 'avg_held_out']].round(4).to_dict('records'),
                order=order, harmful_sorted_last=bool(harmful) and set(order[-len(harmful):]) == set(harmful),
                removal_lowers_uncertainty=[h for h in harmful if df[df.what == f'merge all but {h}'].uncertainty.iloc[0] < allr.uncertainty])


def vectors(args):
    "c. Task vectors τ = θ_variant − θ_base over adapter + language model: norms, cosines, share of the all-models mean."
    import torch
    from fusion_nb.llava.model import load_llava, llava_part
    P, root, manifest, models, *_ = setup(args.profile, args.candidate)
    def flat(src):
        m, _ = load_llava(src)
        return torch.cat([t.detach().flatten().double() for k, t in m.state_dict().items() if llava_part(k) != 'vision'])
    b = flat(root/'base'); taus = {n: flat(p) - b for n, p in models.items()}
    names = list(taus); T = torch.stack([taus[n] for n in names])
    norms = T.norm(dim=1); cos = (T @ T.T) / (norms[:, None] * norms[None, :])
    mean_tau = T.mean(0)
    harmful = [n for n, v in manifest['variants'].items() if is_harmful(v)]
    clean = [n for n in names if n not in harmful]
    ic = [names.index(n) for n in clean]
    per = {n: dict(norm=float(norms[i]), norm_over_base=float(norms[i] / b.norm()),
                   mean_cos_clean=float(np.mean([float(cos[i, j]) for j in ic if j != i])),
                   cos_with_mean=float(torch.dot(T[i], mean_tau) / (norms[i] * mean_tau.norm())),
                   recipe={k: manifest['variants'][n].get(k) for k in ('tasks', 'captions', 'steps', 'lr', 'first_loss', 'last_loss')})
           for i, n in enumerate(names)}
    clean_mean = T[ic].mean(0)   # what the merge moves by without the harmful variants
    return dict(base_norm=float(b.norm()), per_model=per, cos=pd.DataFrame(cos.numpy(), names, names).round(3).to_dict(),
                mean_tau_norm=float(mean_tau.norm()), clean_mean_tau_norm=float(clean_mean.norm()),
                all_vs_clean_merge_distance_over_clean_tau=float((mean_tau - clean_mean).norm() / clean_mean.norm()),
                merge_shift_over_base=float(mean_tau.norm() / b.norm()))


TABLE1_METHODS = ['dare_task_arithmetic', 'della', 'ties_merging', 'task_arithmetic', 'model_stock']   # experiment 40's baselines but Linear (= UQ-Merge's all-models merge)

def questions(args):
    """g. How much of experiment 40's build spread its questions make: Table 1's merges of all the models (UQ-Merge keeps all
    of them on tiny, so every random selection is the whole pool) on this zoo, evaluated on other draws of the question sets
    (zoo_benchmark's seed; draw 0 is the experiment's), with the profile's count and with --n. The differences UQ-Merge minus
    each baseline then move across draws by the questions alone; the build spread file has how they move across builds."""
    from fusion_nb.merge import MERGE_METHODS
    from fusion_nb.llava.uq_merge import merge_llava
    from fusion_nb.llava.model import load_llava
    from fusion_nb.llava.zoo import zoo_benchmark
    P, root, _, models, held_in, _, _ = setup(args.profile, args.candidate)   # no eq. 1 here: J unused
    n0 = len(next(iter(held_in.values())))
    tmp = Path(tempfile.mkdtemp(prefix='uq-questions-'))
    merged = {}
    try:
        for m in ['linear', *TABLE1_METHODS]:
            spec = MERGE_METHODS[m]
            kw = spec.paper_settings('004') if m != 'linear' else {}
            d = merge_llava(m, models, tmp/m, pretrained=root/'base' if spec.needs_pretrained else None, **kw)
            merged[m] = load_llava(d, device=P.device)
        rows = []
        for n in sorted({n0, *args.n}):
            for draw in range(args.draws):
                hi, ho = zoo_benchmark(n, n, seed=P.seed + draw)
                ev = evaluator(P, hi, ho)
                acc = {m: ev(*mp) for m, mp in merged.items()}
                for m in TABLE1_METHODS:
                    for c in ['avg_held_in', 'avg_held_out']:
                        rows.append(dict(n=n, draw=draw, method=m, metric=c, ours=acc['linear'][c], baseline=acc[m][c],
                                         difference=acc['linear'][c] - acc[m][c]))
                print(n, draw, {m: round(acc[m]['avg_held_in'], 2) for m in acc}, flush=True)
    finally: shutil.rmtree(tmp, ignore_errors=True)
    df = pd.DataFrame(rows)
    g = df.groupby(['metric', 'method', 'n']).difference
    summary = pd.DataFrame({'mean': g.mean(), 'sd': g.std(ddof=1), 'range': g.max() - g.min(), 'draw0': g.first()}).round(2).reset_index()
    builds = build_differences(args.profile)
    summary = summary.merge(builds, on=['metric', 'method'], how='left')
    print(summary.to_string())
    return dict(questions_per_set=sorted({n0, *args.n}), draws=args.draws, rows=df.round(3).to_dict('records'),
                summary=summary.to_dict('records'),
                mean_sd=summary.groupby(['metric', 'n'])['sd'].mean().round(2).reset_index().to_dict('records'),
                mean_build_sd=summary.groupby('metric')['build_sd'].mean().round(2).to_dict())


def competence(args):
    """h. Whom each held-in set measures: per held-in set, the base's accuracy, its specialist's (the variant tuned on the set's
    task, `HELD_IN_ROLES`), the median of the other variants' and the Linear merge of all of them, against chance (one over the
    options). Paper 004's held-in sets measure a competence its whole pool shares (LLaVA-v1.5-7B 54.8-72.0 on the five, merges
    43-70; Table 1); experiment 40's held-in comparisons need that, not a set each only one specialist answers."""
    from fusion_nb.llava.model import load_llava
    from fusion_nb.llava.uq_merge import merge_llava
    from fusion_nb.llava.zoo import HELD_IN_ROLES
    P, root, manifest, models, held_in, held_out, _ = setup(args.profile, args.candidate)
    ev0, tmp = evaluator(P, held_in, {}), Path(tempfile.mkdtemp(prefix='uq-competence-'))
    def ev(model, proc):   # held-in only: no held-out set, so no held-out average
        import warnings
        with warnings.catch_warnings(): warnings.simplefilter('ignore', RuntimeWarning); return ev0(model, proc)
    try:
        acc = {n: ev(*load_llava(src, device=P.device)) for n, src in {'base': root/'base', **models}.items()}
        acc['linear (all)'] = ev(*load_llava(merge_llava('linear', models, tmp/'linear'), device=P.device))
    finally: shutil.rmtree(tmp, ignore_errors=True)
    chance = {r: 100 / len(its[0].options) for r, its in held_in.items()}
    rows = []
    for r, t in HELD_IN_ROLES.items():
        others = [acc[n][r] for n in models if n != t]
        rows.append(dict(held_in=r, task=t, chance=chance[r], base=acc['base'][r], specialist=acc[t][r], others_median=float(np.median(others)),
                         others_max=float(np.max(others)), linear_all=acc['linear (all)'][r]))
    df = pd.DataFrame(rows).round(2)
    print(df.to_string())
    return dict(zoo=root.name, questions_per_set=len(next(iter(held_in.values()))), per_set=df.to_dict('records'),
                models={n: {k: round(v, 2) for k, v in a.items() if k in held_in or k == 'avg_held_in'} for n, a in acc.items()},
                base_above_chance=round(float((df.base - df.chance).mean()), 2), others_above_chance=round(float((df.others_median - df.chance).mean()), 2),
                specialist_above_others=round(float((df.specialist - df.others_median).mean()), 2))


def collapse(args):
    """i. What the harmful variants do to the task-arithmetic family's merges: Task Arithmetic, DARE and DELLA at paper 004's settings, and Linear,
    merging all the models, the clean ones only, and all but the first harmful one, on this build's zoo (another build:
    FUSION_NB_BUILD_SEED=S in the copy holding it); both accuracies. Experiment 40's held-out comparisons move with it."""
    from fusion_nb.merge import MERGE_METHODS
    from fusion_nb.llava.uq_merge import merge_llava
    from fusion_nb.llava.model import load_llava
    P, root, manifest, models, held_in, held_out, _ = setup(args.profile, args.candidate)
    harmful = [n for n, v in manifest['variants'].items() if is_harmful(v)]
    pools = {'all': models, 'clean': {n: p for n, p in models.items() if n not in harmful},
             f'all but {harmful[0]}': {n: p for n, p in models.items() if n != harmful[0]}}
    ev, tmp, rows = evaluator(P, held_in, held_out), Path(tempfile.mkdtemp(prefix='uq-collapse-')), []
    try:
        for m in ['task_arithmetic', 'dare', 'della', 'linear']:   # Table 1's held-out comparisons that vary between builds, and UQ-Merge's own rule
            kw = MERGE_METHODS[m].paper_settings('004')
            for name, pool in pools.items():
                d = merge_llava(m, pool, tmp/f"{m}-{len(rows)}", pretrained=root/'base' if MERGE_METHODS[m].needs_pretrained else None, **kw)   # as experiment 40 merges
                r = ev(*load_llava(d, device=P.device)); rows.append(dict(method=m, pool=name, **{k: round(v, 2) for k, v in r.items()}))
                print(m, name, round(r['avg_held_in'], 2), round(r['avg_held_out'], 2), flush=True)
    finally: shutil.rmtree(tmp, ignore_errors=True)
    return dict(zoo=root.name, harmful=harmful, rows=rows)


def build_differences(profile:str)->pd.DataFrame:
    "UQ-Merge minus each baseline per build, from the profile's spread file's Table 1 means (experiment 40's judged rows), with their sd and range."
    from fusion_nb.reproduce.reports import ROW_LABELS
    path = REPO/'data'/'paper_values'/f'build_spread_{profile}.csv'
    if not path.exists(): return pd.DataFrame(columns=['metric', 'method', 'builds', 'build_sd', 'build_range'])
    f = pd.read_csv(path, comment='#')
    f = f[(f.experiment == '40_uq_merge') & (f.table == 'table1_mean')].set_index('row')
    seeds = [c for c in f.columns if c.startswith('seed ')]
    out = []
    for m in TABLE1_METHODS:
        for c in ['avg_held_in', 'avg_held_out']:
            d = f.loc[f'UQ-Merge (ours) · {c}', seeds].astype(float) - f.loc[f'{ROW_LABELS[m]} · {c}', seeds].astype(float)
            out.append(dict(metric=c, method=m, builds=d.round(2).tolist(), build_sd=round(float(d.std(ddof=1)), 2),
                            build_range=round(float(d.max() - d.min()), 2)))
    return pd.DataFrame(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('what', choices=['paper', 'pool', 'loo', 'chained', 'noise', 'vectors', 'screen', 'questions', 'competence', 'collapse'])
    ap.add_argument('--candidate', default='default', help=f'a pool of CANDIDATES ({", ".join(CANDIDATES)}) or a JSON spec (keys of CAND_DEFAULTS)')
    ap.add_argument('--profile', default='tiny')
    ap.add_argument('--passes', type=int, default=None, help="J of eq. 1 (default: the profile's llava_passes, else DEFAULT_J; the authors' code: 4)")
    ap.add_argument('--n', type=int, nargs='*', default=[256], help='questions: counts per set besides the profile\'s')
    ap.add_argument('--draws', type=int, default=5, help='questions: draws of the question sets per count (draw 0: the experiment\'s)')
    a = ap.parse_args(argv)
    global PASSES; PASSES = a.passes
    t0 = time.perf_counter()
    out = globals()[a.what](a)
    out['seconds'] = round(time.perf_counter() - t0, 1)
    d = REPO/'outputs'/'diagnose_uq_merge'/a.profile; d.mkdir(parents=True, exist_ok=True)
    out['candidate'] = a.candidate
    stem = a.what + ('' if a.candidate == 'default' else f'-{candidate_name(a.candidate)}') + (f'-J{a.passes}' if a.passes else '')
    (d/f'{stem}.json').write_text(json.dumps(out, indent=2, default=str))
    print(json.dumps(out, indent=1, default=str)[:6000])


if __name__ == '__main__': main()
