"""The model workloads that scripts/record_workloads.py records: each builds a Hugging Face
``transformers`` (or ``diffusers``, or plain ``torch.nn``) model from a configuration in code
(random weights: nothing is downloaded) and returns one step of it to run. docs/replay.md,
"Recorded workloads", lists them with their peaks. The ones here are those gpumm's pool was
tuned on; scripts/workloads_heldout.py holds the ones recorded to test it on others.
"""

from __future__ import annotations

from typing import Dict

from workload_steps import Step, Workload, adamw_step, generate_step, image_classifier_step
from workloads_heldout import HELD_OUT

__all__ = ["WORKLOADS", "Workload"]


def gpt2_decode() -> Step:
    """GPT-2 small (the default GPT2Config: 12 layers, d_model 768, 12 heads, vocabulary
    50257), batch 2, a 32-token prompt, 160 new tokens by greedy ``generate`` with the KV
    cache."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return generate_step(GPT2LMHeadModel(GPT2Config()), 50257, 2, 32, 160)


def llama_decode() -> Step:
    """Token-by-token decoding with grouped-query attention: transformers' Llama with a shrunk
    configuration (8 layers, hidden 512, 8 heads, 2 key/value heads, intermediate 1376,
    vocabulary 32000, RoPE), batch 4, a 64-token prompt, 192 new tokens by greedy
    ``generate`` with the KV cache."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=32000, hidden_size=512, intermediate_size=1376,
                      num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2,
                      max_position_embeddings=512)
    return generate_step(LlamaForCausalLM(cfg), 32000, 4, 64, 192)


def t5_train() -> Step:
    """T5-small (the default T5Config: 6 + 6 layers, d_model 512, 8 heads, d_ff 2048,
    vocabulary 32128), batch 8, 128 source and 32 target tokens, AdamW."""
    import torch
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    # t5-small's ids (the default configuration leaves the decoder's start id unset)
    model = T5ForConditionalGeneration(T5Config(decoder_start_token_id=0, pad_token_id=0))
    src = torch.randint(0, 32128, (8, 128))
    tgt = torch.randint(0, 32128, (8, 32))
    return adamw_step(model, lambda: model(input_ids=src, labels=tgt).loss)


def vit_train() -> Step:
    """ViT-base (the default ViTConfig: 12 layers, hidden 768, 12 heads, patch 16, 224 × 224
    images, 197 tokens) with a 10-class head, batch 4, AdamW."""
    import torch
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    return image_classifier_step(ViTForImageClassification(ViTConfig(num_labels=10)), 4, 224)


def unet_train() -> Step:
    """A DDPM training step of a diffusers UNet2DModel (64 × 64 RGB, block channels 64, 128,
    256, 256, two ResNet layers per block, attention in the two lowest-resolution down and
    up blocks), batch 4: noise added at random timesteps by DDPMScheduler (1000 steps), MSE
    on the predicted noise, AdamW."""
    import torch
    from diffusers import DDPMScheduler, UNet2DModel

    torch.manual_seed(0)
    model = UNet2DModel(
        sample_size=64, in_channels=3, out_channels=3, layers_per_block=2,
        block_out_channels=(64, 128, 256, 256),
        down_block_types=("DownBlock2D", "DownBlock2D", "AttnDownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "AttnUpBlock2D", "UpBlock2D", "UpBlock2D"),
    )
    sched = DDPMScheduler(num_train_timesteps=1000)
    images = torch.randn(4, 3, 64, 64)

    def loss():
        noise = torch.randn_like(images)
        t = torch.randint(0, 1000, (images.shape[0],))
        noisy = sched.add_noise(images, noise, t)
        return torch.nn.functional.mse_loss(model(noisy, t).sample, noise)

    return adamw_step(model, loss)


def mixtral_moe_train() -> Step:
    """A mixture-of-experts decoder: transformers' Mixtral with a shrunk configuration
    (4 layers, hidden 256, 8 heads, 4 key/value heads, intermediate 512, 8 experts, top-2
    routing, vocabulary 32000), batch 4 × 128 tokens, causal-LM loss with the router's
    auxiliary loss, AdamW."""
    import torch
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(0)
    cfg = MixtralConfig(vocab_size=32000, hidden_size=256, intermediate_size=512,
                        num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
                        num_local_experts=8, num_experts_per_tok=2, output_router_logits=True,
                        max_position_embeddings=512)
    model = MixtralForCausalLM(cfg)
    ids = torch.randint(0, 32000, (4, 128))
    return adamw_step(model, lambda: model(input_ids=ids, labels=ids).loss)


def llama_train_512() -> Step:
    """A decoder-only LM trained on 512-token sequences: transformers' Llama with a shrunk
    configuration (8 layers, hidden 512, 8 heads, intermediate 1376, vocabulary 32000, RoPE),
    batch 2 × 512 tokens, AdamW."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=32000, hidden_size=512, intermediate_size=1376,
                      num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=8,
                      max_position_embeddings=1024)
    model = LlamaForCausalLM(cfg)
    ids = torch.randint(0, 32000, (2, 512))
    return adamw_step(model, lambda: model(input_ids=ids, labels=ids).loss)


def bart_beam() -> Step:
    """Beam search in an encoder-decoder: transformers' BART with a shrunk configuration
    (3 + 3 layers, d_model 256, 4 heads, feed-forward 1024, vocabulary 16000), batch 2, a
    96-token source, 40 new tokens by ``generate`` with 4 beams and the KV cache (each step
    reorders the cache of the beams it keeps)."""
    import torch
    from transformers import BartConfig, BartForConditionalGeneration

    torch.manual_seed(0)
    cfg = BartConfig(vocab_size=16000, d_model=256, encoder_layers=3, decoder_layers=3,
                     encoder_attention_heads=4, decoder_attention_heads=4,
                     encoder_ffn_dim=1024, decoder_ffn_dim=1024, max_position_embeddings=256,
                     pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
                     forced_eos_token_id=None)
    model = BartForConditionalGeneration(cfg).eval()
    src = torch.randint(3, 16000, (2, 96))
    mask = torch.ones_like(src)

    def step() -> None:
        with torch.no_grad():
            out = model.generate(src, attention_mask=mask, num_beams=4, max_new_tokens=40,
                                 min_new_tokens=40, do_sample=False, early_stopping=False,
                                 use_cache=True)
        assert out.shape[0] == 2 and out.shape[1] >= 40, out.shape

    return step


def wav2vec2_ctc_train() -> Step:
    """A speech model's training step: transformers' Wav2Vec2 with CTC, its default
    convolutional feature encoder (7 layers of 512 channels, 320 samples a frame) and a
    shrunk transformer (4 layers, hidden 384, 6 heads, intermediate 1536), batch 2 × 2 s of
    random 16 kHz audio, 40-label random transcripts (vocabulary 32), AdamW."""
    import torch
    from transformers import Wav2Vec2Config, Wav2Vec2ForCTC

    torch.manual_seed(0)
    cfg = Wav2Vec2Config(vocab_size=32, hidden_size=384, num_hidden_layers=4,
                         num_attention_heads=6, intermediate_size=1536, pad_token_id=0,
                         ctc_loss_reduction="mean", mask_time_prob=0.0)
    model = Wav2Vec2ForCTC(cfg)
    audio = torch.randn(2, 32000)
    labels = torch.randint(1, 32, (2, 40))
    return adamw_step(model, lambda: model(input_values=audio, labels=labels).loss)


def convnext_train() -> Step:
    """ConvNeXt-tiny (the default ConvNextConfig: stages of 3, 3, 9, 3 blocks, 96 to 768
    channels, 7 × 7 depth-wise convolutions, layer norm) with a 10-class head, batch 4 ×
    160 × 160 images, AdamW."""
    import torch
    from transformers import ConvNextConfig, ConvNextForImageClassification

    torch.manual_seed(0)
    model = ConvNextForImageClassification(ConvNextConfig(num_labels=10, image_size=160))
    return image_classifier_step(model, 4, 160)


def bert_mlm_varlen() -> Step:
    """A masked-LM training step on batches padded to their own length: transformers' BERT
    with a shrunk configuration (4 layers, hidden 256, 4 heads, intermediate 1024, vocabulary
    30522), batch 8, each step's sequences padded to the next of 128, 77, 203 tokens (the
    warm-up takes the first; the recorded steps see lengths not seen before, the second longer
    than any before it), 15 % of the real tokens masked, AdamW."""
    import torch
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=30522, hidden_size=256, num_hidden_layers=4,
                     num_attention_heads=4, intermediate_size=1024, max_position_embeddings=512)
    model = BertForMaskedLM(cfg)
    lengths = iter([128, 77, 203] * 4)

    def loss():
        n = next(lengths)
        real = torch.randint(n // 2, n + 1, (8,))  # each sequence's own length, then padding
        mask = (torch.arange(n)[None, :] < real[:, None]).long()
        ids = torch.randint(1000, 30522, (8, n)) * mask
        chosen = (torch.rand(8, n) < 0.15) & mask.bool()
        labels = torch.where(chosen, ids, torch.full_like(ids, -100))
        masked = torch.where(chosen, torch.full_like(ids, 103), ids)
        return model(input_ids=masked, attention_mask=mask, labels=labels).loss

    return adamw_step(model, loss)


def vae_train() -> Step:
    """A diffusers AutoencoderKL training step (block channels 64, 128, 256, one ResNet layer
    a block, 4 latent channels, a mid-block with attention), batch 2 × 128 × 128 RGB:
    reconstruction MSE plus 1e-6 × the KL term, AdamW."""
    import torch
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    model = AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=4, layers_per_block=1,
        block_out_channels=(64, 128, 256),
        down_block_types=("DownEncoderBlock2D",) * 3, up_block_types=("UpDecoderBlock2D",) * 3,
        norm_num_groups=32, sample_size=128,
    )
    images = torch.randn(2, 3, 128, 128)

    def loss():
        post = model.encode(images).latent_dist
        rec = model.decode(post.sample()).sample
        return torch.nn.functional.mse_loss(rec, images) + 1e-6 * post.kl().mean()

    return adamw_step(model, loss)


def distilbert_serve() -> Step:
    """Inference batches of varying size and length, as a server sees them: transformers'
    DistilBERT (the default DistilBertConfig: 6 layers, dim 768, 12 heads, vocabulary 30522)
    with a 3-class head under ``torch.inference_mode``, 8 batches of 1, 8, 3, 16, 5, 12, 2
    and 7 sequences, each padded to its longest (lengths drawn from 16-160)."""
    import torch
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    torch.manual_seed(0)
    model = DistilBertForSequenceClassification(DistilBertConfig(num_labels=3)).eval()
    batches = []
    for b in (1, 8, 3, 16, 5, 12, 2, 7):
        real = torch.randint(16, 161, (b,))
        n = int(real.max())
        mask = (torch.arange(n)[None, :] < real[:, None]).long()
        batches.append((torch.randint(1000, 30522, (b, n)) * mask, mask))

    def step() -> None:
        with torch.inference_mode():
            for ids, mask in batches:
                out = model(input_ids=ids, attention_mask=mask).logits
                assert out.shape == (ids.shape[0], 3), out.shape

    return step


def lstm_lm_train() -> Step:
    """A recurrent language model (not a transformer): ``torch.nn`` embedding 10000 × 256, a
    2-layer LSTM of hidden 512, a linear head, batch 16 × 64 tokens, cross-entropy, AdamW."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.ModuleDict({
        "emb": torch.nn.Embedding(10000, 256),
        "lstm": torch.nn.LSTM(256, 512, num_layers=2, batch_first=True),
        "head": torch.nn.Linear(512, 10000),
    })
    ids = torch.randint(0, 10000, (16, 65))

    def loss():
        out, _ = model["lstm"](model["emb"](ids[:, :-1]))
        logits = model["head"](out)
        return torch.nn.functional.cross_entropy(logits.reshape(-1, 10000), ids[:, 1:].reshape(-1))

    return adamw_step(model, loss)


def swin_train() -> Step:
    """Shifted-window attention: transformers' Swin (the default SwinConfig: embedding 96,
    stages of 2, 2, 6, 2 blocks, windows of 7, 224²) with a 10-class head, batch 2, AdamW."""
    import torch
    from transformers import SwinConfig, SwinForImageClassification

    torch.manual_seed(0)
    return image_classifier_step(SwinForImageClassification(SwinConfig(num_labels=10)), 2, 224)


def resnet_serve_varres() -> Step:
    """Inference on images of varying resolution, as a detection or serving front end sees
    them: transformers' ResNet (the default ResNetConfig: ResNet-50's stages) under
    ``torch.inference_mode``, 6 batches of (2, 224²), (1, 320²), (4, 160²), (3, 256²),
    (1, 384²), (2, 192²)."""
    import torch
    from transformers import ResNetConfig, ResNetForImageClassification

    torch.manual_seed(0)
    model = ResNetForImageClassification(ResNetConfig(num_labels=10)).eval()
    batches = [torch.randn(b, 3, r, r)
               for b, r in ((2, 224), (1, 320), (4, 160), (3, 256), (1, 384), (2, 192))]

    def step() -> None:
        with torch.inference_mode():
            for x in batches:
                assert model(pixel_values=x).logits.shape == (x.shape[0], 10)

    return step


def gpt2_train_ckpt() -> Step:
    """Activation checkpointing (each block's activations recomputed in the backward pass):
    transformers' GPT-2 with a shrunk configuration (6 layers, d_model 512, 8 heads,
    vocabulary 16000) and ``gradient_checkpointing_enable()``, batch 4 × 256 tokens, AdamW."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=6, n_embd=512, n_head=8, vocab_size=16000,
                                       n_positions=512, bos_token_id=0, eos_token_id=0))
    model.gradient_checkpointing_enable()
    ids = torch.randint(0, 16000, (4, 256))
    return adamw_step(model, lambda: model(input_ids=ids, labels=ids).loss)


def whisper_train() -> Step:
    """Speech-to-text with a convolutional front end on log-mel features: transformers'
    Whisper with a shrunk configuration (4 + 4 layers, d_model 256, 4 heads, feed-forward
    1024, vocabulary 8000, 80 mel bins), batch 2 × 1,500 frames (15 s), 64-token random
    transcripts, AdamW."""
    import torch
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    torch.manual_seed(0)
    cfg = WhisperConfig(d_model=256, encoder_layers=4, decoder_layers=4,
                        encoder_attention_heads=4, decoder_attention_heads=4,
                        encoder_ffn_dim=1024, decoder_ffn_dim=1024, vocab_size=8000,
                        num_mel_bins=80, max_source_positions=750, max_target_positions=128,
                        decoder_start_token_id=1, pad_token_id=0, bos_token_id=1,
                        eos_token_id=2)
    model = WhisperForConditionalGeneration(cfg)
    feats = torch.randn(2, 80, 1500)
    labels = torch.randint(2, 8000, (2, 64))
    return adamw_step(model, lambda: model(input_features=feats, labels=labels).loss)


def sd_unet_denoise() -> Step:
    """Text-conditioned latent diffusion sampling: a diffusers UNet2DConditionModel (32 × 32
    × 4 latents, block channels 64, 128, 256, cross-attention to 77 × 256 text states in the
    two upper down and up blocks, one ResNet layer a block) under ``torch.inference_mode``,
    10 denoising steps with classifier-free guidance (the conditioned and unconditioned
    latents in one batch of 2, as pipelines run them)."""
    import torch
    from diffusers import UNet2DConditionModel

    torch.manual_seed(0)
    model = UNet2DConditionModel(
        sample_size=32, in_channels=4, out_channels=4, layers_per_block=1,
        block_out_channels=(64, 128, 256), cross_attention_dim=256, attention_head_dim=8,
        down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
    ).eval()
    text = torch.randn(2, 77, 256)

    def step() -> None:
        with torch.inference_mode():
            x = torch.randn(1, 4, 32, 32)
            for i in range(10):
                noise = model(torch.cat([x, x]), 999 - 100 * i, encoder_hidden_states=text).sample
                plain, cond = noise.chunk(2)
                x = x - 0.1 * (plain + 7.5 * (cond - plain))

    return step


def mamba_train() -> Step:
    """A state-space language model (no attention): transformers' Mamba with a shrunk
    configuration (4 layers, hidden 256, state 16, vocabulary 8000; its reference selective
    scan in plain PyTorch, a step a token), batch 4 × 128 tokens, AdamW."""
    import torch
    from transformers import MambaConfig, MambaForCausalLM

    torch.manual_seed(0)
    model = MambaForCausalLM(MambaConfig(vocab_size=8000, hidden_size=256,
                                         num_hidden_layers=4, state_size=16))
    ids = torch.randint(0, 8000, (4, 128))
    return adamw_step(model, lambda: model(input_ids=ids, labels=ids).loss)


def clip_train() -> Step:
    """Contrastive image-text training, two towers in one step: transformers' CLIP with a
    shrunk configuration (text: 4 layers, hidden 256, vocabulary 8000; vision: 6 layers,
    hidden 384, 224² images in 32 × 32 patches; projection 256), batch 16 pairs, the
    contrastive loss, AdamW."""
    import torch
    from transformers import CLIPConfig, CLIPModel

    torch.manual_seed(0)
    cfg = CLIPConfig(
        text_config=dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                         intermediate_size=1024, vocab_size=8000, bos_token_id=0,
                         eos_token_id=2),
        vision_config=dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=6,
                           intermediate_size=1536, image_size=224, patch_size=32),
        projection_dim=256)
    model = CLIPModel(cfg)
    pixels = torch.randn(16, 3, 224, 224)
    ids = torch.randint(0, 8000, (16, 32))
    return adamw_step(model, lambda: model(input_ids=ids, pixel_values=pixels,
                                            return_loss=True).loss)


def roberta_bf16_train() -> Step:
    """Mixed precision (the forward pass under ``torch.autocast`` to bfloat16: each weight
    cast every step, float32 master weights and gradients): transformers' RoBERTa with a
    shrunk configuration (6 layers, hidden 512, 8 heads, intermediate 2048, vocabulary 20000)
    and a 3-class head, batch 8 × 128 tokens, AdamW."""
    import torch
    from transformers import RobertaConfig, RobertaForSequenceClassification

    torch.manual_seed(0)
    model = RobertaForSequenceClassification(RobertaConfig(
        hidden_size=512, num_hidden_layers=6, num_attention_heads=8, intermediate_size=2048,
        vocab_size=20000, num_labels=3))
    ids = torch.randint(3, 20000, (8, 128))
    labels = torch.randint(0, 3, (8,))

    def loss():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return model(input_ids=ids, labels=labels).loss

    return adamw_step(model, loss)


# Decoding and T5 come first: they are the ones the replay's crash reproductions need.
WORKLOADS: Dict[str, Workload] = {w.name: w for w in [
    Workload("gpt2_decode", "GPT-2 small, greedy generate, KV cache", gpt2_decode, 1, 1),
    Workload("t5_train", "T5-small, AdamW", t5_train, 1, 2),
    Workload("vit_train", "ViT-base, AdamW", vit_train, 1, 2),
    Workload("unet_train", "diffusers UNet2DModel, DDPM, AdamW", unet_train, 1, 2),
    Workload("mixtral_moe_train", "Mixtral MoE (small), AdamW", mixtral_moe_train, 1, 2),
    Workload("llama_train_512", "Llama (small), 2 x 512 tokens, AdamW", llama_train_512, 1, 2),
    Workload("llama_decode", "Llama (small, grouped-query), greedy generate, KV cache",
             llama_decode, 1, 1),
    Workload("bart_beam", "BART (small), generate, 4 beams, KV cache", bart_beam, 1, 1),
    Workload("wav2vec2_ctc_train", "Wav2Vec2 (small transformer), CTC, random audio, AdamW",
             wav2vec2_ctc_train, 1, 2),
    Workload("convnext_train", "ConvNeXt-tiny, 160 x 160, AdamW", convnext_train, 1, 2),
    Workload("bert_mlm_varlen", "BERT (small) masked LM, a new padded length each step, AdamW",
             bert_mlm_varlen, 1, 2),
    Workload("vae_train", "diffusers AutoencoderKL, MSE + KL, AdamW", vae_train, 1, 2),
    Workload("distilbert_serve", "DistilBERT inference, 8 batches of varying size and length",
             distilbert_serve, 1, 1),
    Workload("lstm_lm_train", "2-layer LSTM language model, 16 x 64 tokens, AdamW",
             lstm_lm_train, 1, 2),
    Workload("swin_train", "Swin-tiny, 224 x 224, AdamW", swin_train, 1, 2),
    Workload("resnet_serve_varres", "ResNet-50 inference, 6 batches of varying resolution",
             resnet_serve_varres, 1, 1),
    Workload("gpt2_train_ckpt", "GPT-2 (small), activation checkpointing, 4 x 256 tokens, AdamW",
             gpt2_train_ckpt, 1, 2),
    Workload("whisper_train", "Whisper (small), 2 x 15 s of log-mel features, AdamW",
             whisper_train, 1, 2),
    Workload("sd_unet_denoise", "diffusers UNet2DConditionModel, 10 guided denoising steps",
             sd_unet_denoise, 1, 1),
    Workload("mamba_train", "Mamba (small), 4 x 128 tokens, AdamW", mamba_train, 1, 2),
    Workload("clip_train", "CLIP (small), 16 image-text pairs, contrastive loss, AdamW",
             clip_train, 1, 2),
    Workload("roberta_bf16_train", "RoBERTa (small), bfloat16 autocast, AdamW",
             roberta_bf16_train, 1, 2),
    *HELD_OUT,
]}
