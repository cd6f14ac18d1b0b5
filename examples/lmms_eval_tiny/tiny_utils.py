"The tiny_pope task's prompt: the question and LLaVA-1.5's short-answer line (as fusion_nb.llava.short_answers asks it)."
def doc_to_visual(doc): return [doc["image"].convert("RGB")]
def doc_to_text(doc, lmms_eval_specific_kwargs=None): return doc["question"] + "\nAnswer the question using a single word or phrase."
