"""A candidate ImageNet stand-in for paper 003 (issue 48, item 3): the same renderers with the objects drawn smaller or larger,
moved further off-centre or shown more often on their class's background, built into a scratch folder so that `bench/diagnose_masking.py` can measure P1–P3 on it. Bench only: the package, the benchmark
build, the zoo and its pins are unchanged.

    python bench/masking_candidate.py --object-scale 0.6 --out D          # renders imagenet and its five shifts into D/<task> (tiny scale)
    python bench/diagnose_masking.py --profile tiny --object-scale 0.6 --datasets D --tag _small06   # P0-P3 on it
    python bench/masking_candidate.py --object-scale 1 --object-jitter 9 --out D   # objects anywhere: a donor's patches show less of its object

Why smaller objects: paper 003's mechanism needs a fine-tuned model that reads the ID context (P1: "vanilla fine-tuning
learns the spurious context", section 3.1.2), which the OOD shifts change. On the pinned stand-in the object is easy
(zero-shot 87.5 %, vanilla FT 98–99 % on ID against the paper's 63.4 / 75.9 for B/32, Table 1), so fine-tuning has no need
of the background although 90 % of training images show their class's own one (`IMAGENET_CUE`), and refilled object
regions (a donor's object at the same place, the objects being near the centre) mislead both models alike (P3 reversed:
`bench/diagnose_masking.md`). A smaller object is harder to recognise and leaves more of the image to the context: the
property to measure is whether that brings P1 and with it P3. `--object-scale f` multiplies the size of every sprite the
ImageNet family draws (ID, shifts, probes and the object masks replayed from the renderer alike), nothing else.
"""
from __future__ import annotations
import argparse, sys, time
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from fusion_nb.tiny import tasks as T


@contextmanager
def object_scale(f:float, jitter:float|None=None, cue:float|None=None):
    """Every sprite `fusion_nb.tiny.tasks` draws while inside, `f` times its size, and the object scenes' centre jitter `jitter` pixels
    (default: the renderers' own), and the share of ID images on their class's own background `cue` (default `IMAGENET_CUE`, 0.9) —
    the renderers look `draw_sprite`, `_object_scene` and `IMAGENET_CUE` up at call time."""
    if not 0.2 <= f <= 2: raise ValueError(f'--object-scale {f} is outside 0.2 … 2')
    if jitter is not None and not 0 <= jitter <= T.S / 2: raise ValueError(f'--object-jitter {jitter} is outside 0 … {T.S / 2}')
    if cue is not None and not 0 <= cue <= 1: raise ValueError(f'--cue {cue} is outside 0 … 1')
    draw, scene, share = T.draw_sprite, T._object_scene, T.IMAGENET_CUE
    def scaled(parts, size, *args, **kw): return draw(parts, size * f, *args, **kw)
    def moved(rng, sprite, bg_name, **kw): return scene(rng, sprite, bg_name, **{**kw, 'jitter': jitter})
    T.draw_sprite = scaled
    if jitter is not None: T._object_scene = moved
    if cue is not None: T.IMAGENET_CUE = cue
    try: yield
    finally: T.draw_sprite, T._object_scene, T.IMAGENET_CUE = draw, scene, share


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--object-scale', type=float, required=True, help='factor on every sprite size of the ImageNet family')
    ap.add_argument('--object-jitter', type=float, default=None, help="pixels an object scene's centre moves (the renderers': 4)")
    ap.add_argument('--cue', type=float, default=None, help="share of ID images on their class's own background (IMAGENET_CUE: 0.9)")
    ap.add_argument('--out', required=True, help='folder receiving one dataset folder per task (imagenet and its shifts)')
    ap.add_argument('--scale', default='tiny', choices=list(T.SCALES))
    a = ap.parse_args(argv)
    t0 = time.time()
    with object_scale(a.object_scale, a.object_jitter, a.cue):
        T.build_datasets(a.out, a.scale, tasks=T.IMAGENET_TASKS, progress=False)
        # a look at what changed: 8 training images of every class, one row a class, enlarged 3x
        from PIL import Image
        grid = Image.fromarray(T.sample_grid('imagenet', per_class=8))
        grid.resize((3 * grid.width, 3 * grid.height), Image.NEAREST).save(Path(a.out)/'sample_grid.png')
    print(f'built {", ".join(T.IMAGENET_TASKS)} into {a.out} in {time.time() - t0:.0f} s')


if __name__ == '__main__':
    main()
