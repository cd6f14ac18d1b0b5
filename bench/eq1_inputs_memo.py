"""Eq. 1 of one tiny LLaVA over the held-in sets with and without `INPUTS` (the processor's batches kept per draw), in one run.

    python bench/eq1_inputs_memo.py [--profile tiny] [--reps 2]

Experiment 40 measures eq. 1 for every model and every merge on the same questions and draws; without the memo each
measurement draws the AugMix images and system prompts again and runs the processor again (resize, normalise, tokenise)
for every item (before 2026-12-06 the draws had a memo of their own, `DRAWS`, and this bench timed the processor alone).
Prints the seconds of each measurement, alternating without / with the memo (the memo warmed first, as it is after the
first model), their ratio, and checks that both give the same uncertainty to the bit. The zoo is the profile's (built or restored from pins on first use).
"""
from __future__ import annotations
import argparse, os, time

def first_zoo_model(profile:str, n_held_out:int|None=None):
    "The profile's LLaVA zoo (built or restored from pins), its first variant loaded, and experiment 40's questions (held-out: the profile's count unless given)."
    import torch
    torch.set_num_threads(int(os.environ.get('OMP_NUM_THREADS', 1)))
    from fusion_nb.reproduce.profiles import load_profile, prepare
    from fusion_nb.llava.zoo import ZOO, llava_zoo, zoo_benchmark
    from fusion_nb.llava.model import load_llava
    P = prepare(load_profile(profile), build=False)
    recipe = dict(ZOO) | dict(zip(['pretrain_steps', 'general_steps', 'tune_steps'], map(int, P.extra['llava_zoo_steps'].split())))
    root, manifest = llava_zoo(P.root/'data'/P.build/'llava', recipe, progress=False)
    held_in, held_out = zoo_benchmark(int(P.extra['llava_n_held_in']), n_held_out or int(P.extra['llava_n_held_out']), seed=P.seed)
    name, v = next(iter(manifest['variants'].items()))
    return (P, held_in, held_out, name, *load_llava(root/v['path']))

def alternate(measure, use, reps:int):
    "Seconds of `measure()` alternating without / with a memo (`use(True)` installs it, `use(False)` a memo that keeps nothing), and whether every call gave the same value; the memo installed at the end."
    times, values = {'without': [], 'with': []}, set()
    for _ in range(reps):
        for label in times:
            use(label == 'with')
            t = time.perf_counter(); values.add(measure()); times[label].append(time.perf_counter() - t)
    use(True)
    return times, len(values) == 1

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--profile', default='tiny'); ap.add_argument('--reps', type=int, default=2)
    a = ap.parse_args()
    import torch
    from fusion_nb.llava import uncertainty as U
    P, held_in, _, name, model, proc = first_zoo_model(a.profile, n_held_out=1)
    measure = lambda: U.held_in_uncertainty(model, proc, held_in, seed=P.seed)['uncertainty']
    memo = U.INPUTS
    measure()   # draws and the memo warm, as after experiment 40's first model
    def use(on): U.INPUTS = memo if on else U.InputMemo(max_bytes=0)
    times, same = alternate(measure, use, a.reps)
    n = sum(len(v) for v in held_in.values())
    print(f'profile {P.name}, model {name}, {n} held-in questions, J = {U.DEFAULT_J}, torch threads {torch.get_num_threads()}')
    for label, ts in times.items(): print(f'  {label:7s} INPUTS: ' + ', '.join(f'{t:.2f} s' for t in ts))
    print(f'  with / without: {sum(times["with"]) / sum(times["without"]):.2f}; the same uncertainty to the bit: {same}')

if __name__ == '__main__': main()
