"""The held-out decoding workloads: ``generate`` with a KV cache in its kinds (learned
positions, a static cache, sampling, speech, speculative, beam search), recorded to test
gpumm's pool on jobs it was not tuned on (docs/reserve.md, "Held-out workloads").
scripts/workloads_heldout.py lists them with the held-out training steps.
"""

from __future__ import annotations

from workload_steps import Step, generate_step


def opt_decode() -> Step:
    """Greedy decoding with learned positions: transformers' OPT with a shrunk configuration
    (6 layers, hidden 512, 8 heads, vocabulary 16000), 3 sequences, a 40-token prompt, 48
    new tokens, KV cache."""
    import torch
    from transformers import OPTConfig, OPTForCausalLM

    torch.manual_seed(0)
    model = OPTForCausalLM(OPTConfig(hidden_size=512, num_hidden_layers=6, ffn_dim=2048,
                                     num_attention_heads=8, vocab_size=16000))
    return generate_step(model, 16000, 3, 40, 48)


def llama_static_decode() -> Step:
    """Decoding into a static KV cache (`cache_implementation="static"`: every layer's keys
    and values allocated once at their full length, as compiled serving does) with
    left-padded prompts of unequal lengths: transformers' Llama with a shrunk configuration
    (6 layers, hidden 512, 8 heads, 4 key/value heads, vocabulary 32000), batch 4 of prompts
    of 24-96 tokens, 64 new tokens greedy."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=32000, hidden_size=512, intermediate_size=1376, num_hidden_layers=6,
        num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=512)).eval()
    lengths = [24, 96, 57, 40]
    ids = torch.randint(1, 32000, (4, max(lengths)))
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):  # left padding: each prompt ends at the last column
        ids[row, :-n] = 0
        mask[row, -n:] = 1

    def step() -> None:
        with torch.no_grad():
            out = model.generate(ids, attention_mask=mask, max_new_tokens=64, min_new_tokens=64,
                                 do_sample=False, cache_implementation="static", pad_token_id=0)
        assert out.shape == (4, max(lengths) + 64), out.shape

    return step


def t5_sample_generate() -> Step:
    """Encoder-decoder generation by nucleus sampling (each token's logits over the vocabulary
    sorted for top-p, a cross-attention cache beside the growing self-attention one): T5-small
    (the default T5Config), batch 4 of 256 source tokens, 48 new tokens, top-p 0.9."""
    import torch
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    model = T5ForConditionalGeneration(T5Config(decoder_start_token_id=0, pad_token_id=0)).eval()
    src = torch.randint(2, 32128, (4, 256))

    def step() -> None:
        with torch.no_grad():
            out = model.generate(src, attention_mask=torch.ones_like(src), max_new_tokens=48,
                                 min_new_tokens=48, do_sample=True, top_p=0.9, top_k=0)
        assert out.shape[0] == 4, out.shape

    return step


def whisper_generate() -> Step:
    """Speech-to-text decoding (an encoder pass over the audio, then token by token with a
    self-attention cache beside the cross-attention one): transformers' Whisper with a
    shrunk configuration (4 + 4 layers, d_model 384, 6 heads, vocabulary 51,865), batch 2
    of 30 s of log-mel features, 48 new tokens greedy."""
    import torch
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    torch.manual_seed(0)
    model = WhisperForConditionalGeneration(WhisperConfig(
        d_model=384, encoder_layers=4, decoder_layers=4, encoder_attention_heads=6,
        decoder_attention_heads=6, encoder_ffn_dim=1536, decoder_ffn_dim=1536)).eval()
    features = torch.randn(2, 80, 3000)

    def step() -> None:
        with torch.no_grad():
            out = model.generate(input_features=features, max_new_tokens=48, min_new_tokens=48,
                                 do_sample=False)
        assert out.shape[0] == 2, out.shape

    return step


def assisted_decode() -> Step:
    """Speculative decoding (`generate(assistant_model=...)`: a 2-layer draft model proposes
    tokens, the 6-layer model checks them in one pass, and both KV caches are cut back to
    the tokens kept): transformers' Llama, both with hidden 512, 8 heads, vocabulary 32000,
    one prompt of 64 tokens, 64 new tokens greedy."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)

    def llama(layers: int):
        return LlamaForCausalLM(LlamaConfig(
            vocab_size=32000, hidden_size=512, intermediate_size=1376, num_hidden_layers=layers,
            num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=512)).eval()

    model, draft = llama(6), llama(2)
    ids = torch.randint(1, 32000, (1, 64))

    def step() -> None:
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=draft,
                                 max_new_tokens=64, min_new_tokens=64, do_sample=False,
                                 pad_token_id=0)
        assert out.shape == (1, 128), out.shape

    return step


def gpt2_beam_generate() -> Step:
    """Beam search (4 beams a sequence: each token the cache of every layer is reordered to
    the beams kept, a copy of it made while the old one lives): transformers' GPT-2 with a
    shrunk configuration (8 layers, hidden 512, 8 heads, vocabulary 32000), batch 4 of
    64-token prompts, 64 new tokens."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=8, n_embd=512, n_head=8, vocab_size=32000)).eval()
    ids = torch.randint(0, 32000, (4, 64))

    def step() -> None:
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=64,
                                 min_new_tokens=64, num_beams=4, do_sample=False, pad_token_id=0)
        assert out.shape == (4, 128), out.shape

    return step
