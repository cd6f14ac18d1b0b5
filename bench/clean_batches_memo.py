"""Experiment 40's clean evaluations of one tiny LLaVA with and without `CLEAN` (the processor's batches kept), and the
dropout seeding of eq. 1 with `torch.manual_seed` against `seed_dropout`, in one run.

    python bench/clean_batches_memo.py [--profile tiny] [--reps 2]

Experiment 40 asks every model and every merge step the same clean questions: the held-in option questions (accuracy,
`answer_accuracy`) and the held-out short-answer ones (`exact_match`, greedy generation). Without the memo the processor
(resize, normalise, tokenise, pad) runs again on every batch for every model. Prints the seconds of one model's clean
evaluation, alternating without / with the memo (warmed first, as after experiment 40's first model), their ratio, and
checks that both give the same accuracies. Then the seeding: `torch.manual_seed` on a machine without CUDA queues a
seeding of every GPU with a formatted stack trace on each call, so its cost grows with the caller's stack (a notebook's
kernel runs cells some 40 frames deep); per call at this script's depth and 40 frames deeper, against `seed_dropout`.
"""
from __future__ import annotations
import argparse, time

def nested(depth, fn):
    "Call `fn` `depth` frames deeper than here."
    return fn() if depth == 0 else nested(depth - 1, fn)

def per_call(seeder, n=2000):
    "Microseconds per call of `seeder(i)`."
    t = time.perf_counter()
    for i in range(n): seeder(i)
    return 1e6 * (time.perf_counter() - t) / n

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--profile', default='tiny'); ap.add_argument('--reps', type=int, default=2)
    a = ap.parse_args()
    import torch
    from fusion_nb.llava import uncertainty as U, short_answers as SA
    from eq1_inputs_memo import alternate, first_zoo_model
    P, held_in, held_out, name, model, proc = first_zoo_model(a.profile)
    def measure():   # experiment 40's `evaluate`, batch sizes as there
        return tuple([U.answer_accuracy(model, proc, its, batch_size=P.batch_size) for its in held_in.values()]
                     + [SA.exact_match(model, proc, its) for its in held_out.values()])
    memo = U.CLEAN
    measure()   # the memo warm, as after experiment 40's first model
    def use(on): U.CLEAN = SA.CLEAN = memo if on else U.BatchMemo(max_bytes=0)
    times, same = alternate(measure, use, a.reps)
    n_in, n_out = (sum(len(v) for v in s.values()) for s in (held_in, held_out))
    print(f'profile {P.name}, model {name}, {n_in} held-in and {n_out} held-out questions, torch threads {torch.get_num_threads()}')
    for label, ts in times.items(): print(f'  {label:7s} CLEAN: ' + ', '.join(f'{t:.2f} s' for t in ts))
    print(f'  with / without: {sum(times["with"]) / sum(times["without"]):.2f}; the same accuracies: {same}')
    cpu = torch.device('cpu')
    for depth in (0, 40):
        old = nested(depth, lambda: per_call(torch.manual_seed))
        new = nested(depth, lambda: per_call(lambda s: U.seed_dropout(s, cpu)))
        print(f'  seeding, {depth:2d} frames deeper: torch.manual_seed {old:.1f} µs, seed_dropout {new:.1f} µs a call')

if __name__ == '__main__': main()
