"""Write a lmms-eval task of 16 POPE-style probes of the tiny benchmark (`tiny_pope`) into this folder, to check that lmms-eval
and fusion_nb.llava.short_answers give the same answers and score on the same LLaVA directory (nbs/llava/64, 'lmms-eval').

    python examples/lmms_eval_tiny/make_tiny_pope.py
    <lmms-eval env>/python -m lmms_eval --model llava_hf --model_args pretrained=<a LLaVA dir>,device=cpu,device_map=cpu \
        --tasks tiny_pope --include_path examples/lmms_eval_tiny --batch_size 1 --output_path /tmp/lmms_out --log_samples
"""
from pathlib import Path
from datasets import Dataset, Features, Image, Value
from fusion_nb.llava.short_answers import yes_no_items

here = Path(__file__).resolve().parent
items = yes_no_items('cifar10', 'test', 16)
Dataset.from_dict({'image': [i.image for i in items], 'question': [i.question for i in items], 'answer': [i.answers[0] for i in items]},
                  features=Features({'image': Image(), 'question': Value('string'), 'answer': Value('string')})).to_parquet(str(here/'tiny_pope.parquet'))
(here/'tiny_pope.yaml').write_text((here/'tiny_pope.yaml.in').read_text().replace('@PARQUET@', str(here/'tiny_pope.parquet')))
print(f"wrote {here/'tiny_pope.parquet'} and {here/'tiny_pope.yaml'}")
