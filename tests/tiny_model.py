"""A tiny random-weight Llama-shaped chat model, built offline for engine and vLLM tests.

hidden 256 with 4 heads (head_dim 64: vLLM's CPU attention needs that), 2 layers, a byte-level BPE
tokenizer trained on a few sentences, and a ChatML chat template. Saved to a folder vLLM and
transformers both load.
"""

from __future__ import annotations

from pathlib import Path

SENTENCES = [
    "Answer the question based on the given documents.",
    "Only give me the answer and do not output any other words.",
    "The following are given documents. Doc 1 (Title: Paris) Paris is the capital of France.",
    "Question: who wrote the novel? Answer: the author of the book was born in London.",
    "What government position was held by the woman who portrayed Corliss Archer in the film Kiss and Tell?",
    "Shirley Temple was an American actress, singer, dancer and diplomat; she served as Chief of Protocol.",
    "Berlin is the capital of Germany and Rome is the capital of Italy, a city of about three million people.",
]
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tiny_model(folder: str | Path, *, seed: int = 0) -> Path:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    specials = ["<unk>", "<|im_start|>", "<|im_end|>", "<pad>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(SENTENCES * 4, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<pad>"
    )
    fast.chat_template = TEMPLATE
    fast.save_pretrained(folder)

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=4096,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).to(torch.float32)
    with torch.no_grad():  # larger logits spread, so greedy decoding is not a near-tie everywhere
        model.lm_head.weight.mul_(20.0)
    model.save_pretrained(folder, safe_serialization=True)
    model.generation_config.save_pretrained(folder)
    return folder
