"""Experiment 40's evaluations of one tiny LLaVA with and without `TOWER` (the vision tower's output kept per pixel
batch), in one run.

    python bench/tower_memo.py [--profile tiny] [--reps 2]

Every model of experiment 40's pool and every merge step has the same CLIP vision tower and is shown the same pixel
batches: the clean held-in and held-out questions and eq. 1's perturbed passes. Without the memo each model computes the
tower again on every batch. Prints the seconds of one model's clean evaluation (held-in accuracy, held-out exact match)
and of its eq. 1 over the held-in sets, alternating without / with the memo (the memo warm first, as after experiment 40's
first model; `CLEAN` and `INPUTS` warm in both), their ratios, and checks that both give the same numbers to the bit.
"Without" is a memo that keeps nothing, so it still computes the keys (about 0.4 ms a batch of 16): the ratio slightly
flatters the memo; experiment 40 run with the code before and after (guide 04) is the comparison without that.
"""
from __future__ import annotations
import argparse

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--profile', default='tiny'); ap.add_argument('--reps', type=int, default=2)
    a = ap.parse_args()
    import torch
    from fusion_nb.llava import uncertainty as U, short_answers as SA
    from eq1_inputs_memo import alternate, first_zoo_model
    P, held_in, held_out, name, model, proc = first_zoo_model(a.profile)
    parts = {'clean evaluation': lambda: tuple([U.answer_accuracy(model, proc, its, batch_size=P.batch_size) for its in held_in.values()]
                                               + [SA.exact_match(model, proc, its) for its in held_out.values()]),   # experiment 40's `evaluate`
             'eq. 1': lambda: U.held_in_uncertainty(model, proc, held_in, seed=P.seed)['uncertainty']}
    memo = U.TOWER
    def use(on): U.TOWER = SA.TOWER = memo if on else U.TowerMemo(max_bytes=0)
    for measure in parts.values(): measure()   # every memo warm, as after experiment 40's first model
    print(f'profile {P.name}, model {name}, {sum(map(len, held_in.values()))} held-in and {sum(map(len, held_out.values()))} '
          f'held-out questions, J = {U.DEFAULT_J}, torch threads {torch.get_num_threads()}')
    for part, measure in parts.items():
        times, same = alternate(measure, use, a.reps)
        print(f'  {part}: ' + '; '.join(f'{label} TOWER ' + ', '.join(f'{t:.2f} s' for t in ts) for label, ts in times.items())
              + f'; with / without {sum(times["with"]) / sum(times["without"]):.2f}; the same numbers: {same}')

if __name__ == '__main__': main()
