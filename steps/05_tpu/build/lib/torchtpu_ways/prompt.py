"""The prompt every way reads: a fixed sentence, tokenized with the checkpoint's own tokenizer."""
from pathlib import Path

# 19 tokens with <bos> on the tiny checkpoint's tokenizer (the article's prompt was 19 tokens on E2B's)
PROMPT = "Here is a short story about a man who made his own home by the water ."


def encode(model_dir: Path, text: str = PROMPT) -> list[int]:
    """Prompt ids as the model expects them: the chat template when the tokenizer has one (the -it model was
    trained on it), and <bos> first: Gemma's tokenizer does not add it, and without it the model echoes."""
    from transformers import AutoTokenizer  # seconds to import: only the parent process needs it

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if tokenizer.chat_template:
        # return_dict=False: Transformers 5 returns a BatchEncoding by default
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                            return_dict=False)
    else:
        ids = tokenizer.encode(text, add_special_tokens=False)
    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else 2
    return list(ids) if list(ids[:1]) == [bos] else [bos, *ids]
