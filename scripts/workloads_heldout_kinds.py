"""Held-out workloads of kinds the other held-out files lack: two-stream and pooled
attention, time-series forecasting, translation, an image decoder's inference,
reinforcement learning's minibatch epochs and data-parallel gradient buckets. Recorded to
test gpumm's pool on jobs it was not tuned on (docs/reserve.md, "Held-out workloads");
scripts/workloads_heldout.py lists them with the others. Each builds its model from a
configuration in code (random weights: nothing is downloaded) and returns one step of it.
"""

from __future__ import annotations

from typing import List

from workload_steps import Step, Workload, adamw_step


def xlnet_train() -> Step:
    """Permutation language modelling's two-stream attention (a content and a query stream,
    relative positions over memory and target): transformers' XLNet with a shrunk
    configuration (6 layers, d_model 384, 6 heads, vocabulary 16000), 4 x 192 tokens, 32
    prediction targets a sequence, AdamW."""
    import torch
    from transformers import XLNetConfig, XLNetLMHeadModel

    torch.manual_seed(0)
    model = XLNetLMHeadModel(XLNetConfig(vocab_size=16000, d_model=384, n_layer=6, n_head=6,
                                         d_inner=1536))
    batch, seq, targets = 4, 192, 32
    ids = torch.randint(0, 16000, (batch, seq))
    perm = torch.zeros(batch, seq, seq)
    perm[:, :, -targets:] = 1.0  # no token sees the targets
    mapping = torch.zeros(batch, targets, seq)
    for k in range(targets):
        mapping[:, k, seq - targets + k] = 1.0
    labels = ids[:, -targets:].contiguous()
    return adamw_step(model, lambda: model(input_ids=ids, perm_mask=perm, target_mapping=mapping,
                                           labels=labels).loss)


def funnel_train() -> Step:
    """Attention over a sequence pooled to half its length at each block, then upsampled
    back for the per-token head: transformers' Funnel Transformer with a shrunk
    configuration (blocks of 2, 2, 2 layers, d_model 384, vocabulary 16000), masked LM,
    8 x 256 tokens, AdamW."""
    import torch
    from transformers import FunnelConfig, FunnelForMaskedLM

    torch.manual_seed(0)
    model = FunnelForMaskedLM(FunnelConfig(vocab_size=16000, block_sizes=[2, 2, 2], d_model=384,
                                           n_head=6, d_head=64, d_inner=1536))
    ids = torch.randint(0, 16000, (8, 256))
    labels = torch.where(torch.rand(8, 256) < 0.15, ids, torch.full_like(ids, -100))
    return adamw_step(model, lambda: model(input_ids=ids, labels=labels).loss)


def patchtst_train() -> Step:
    """Multivariate time-series forecasting over patches of each channel (channel-independent:
    the batch times the channels is the attention's batch): transformers' PatchTST, 64
    series of 21 channels, a 512-step context in patches of 16 (stride 8), 96 steps ahead,
    AdamW."""
    import torch
    from transformers import PatchTSTConfig, PatchTSTForPrediction

    torch.manual_seed(0)
    model = PatchTSTForPrediction(PatchTSTConfig(
        num_input_channels=21, context_length=512, patch_length=16, patch_stride=8,
        prediction_length=96, d_model=128, num_attention_heads=4, num_hidden_layers=3,
        ffn_dim=256))
    past = torch.randn(64, 512, 21)
    future = torch.randn(64, 96, 21)
    return adamw_step(model, lambda: model(past_values=past, future_values=future).loss)


def marian_train() -> Step:
    """Translation with a shared vocabulary (the embedding tied to the output projection of
    every target position): transformers' Marian with a shrunk configuration (4 + 4 layers,
    d_model 256, vocabulary 24000), 16 pairs of 64 source and 72 target tokens, AdamW."""
    import torch
    from transformers import MarianConfig, MarianMTModel

    torch.manual_seed(0)
    model = MarianMTModel(MarianConfig(
        vocab_size=24000, d_model=256, encoder_layers=4, decoder_layers=4,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=1024,
        decoder_ffn_dim=1024, pad_token_id=0, decoder_start_token_id=0))
    src = torch.randint(1, 24000, (16, 64))
    tgt = torch.randint(1, 24000, (16, 72))
    return adamw_step(model, lambda: model(input_ids=src, labels=tgt).loss)


def vae_decode_serve() -> Step:
    """An image decoder's inference at growing resolutions (large convolution activations,
    each freed as the next layer's is made): diffusers' AutoencoderKL (three up blocks of
    64-128 channels) decoding batches of 2 latents at 16, 24 and 32 (images of 128-256)."""
    import torch
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    vae = AutoencoderKL(block_out_channels=(64, 128, 128), layers_per_block=1,
                        down_block_types=("DownEncoderBlock2D",) * 3,
                        up_block_types=("UpDecoderBlock2D",) * 3, latent_channels=4).eval()
    latents = [torch.randn(2, 4, side, side) for side in (16, 24, 32)]

    def step() -> None:
        with torch.no_grad():
            for z in latents:
                vae.decode(z)

    return step


def ppo_update() -> Step:
    """Reinforcement learning's update (PPO): a rollout of 2048 steps of a 64-d observation,
    then 4 epochs of 32 shuffled minibatches through a policy and a value network (two
    256-wide MLPs), the clipped objective, Adam: many small tensors, every minibatch a new
    gather."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    policy = nn.Sequential(nn.Linear(64, 256), nn.Tanh(), nn.Linear(256, 256), nn.Tanh(),
                           nn.Linear(256, 8))
    value = nn.Sequential(nn.Linear(64, 256), nn.Tanh(), nn.Linear(256, 256), nn.Tanh(),
                          nn.Linear(256, 1))
    opt = torch.optim.Adam(list(policy.parameters()) + list(value.parameters()), 3e-4)

    def step() -> None:
        obs = torch.randn(2048, 64)
        with torch.no_grad():
            dist = torch.distributions.Categorical(logits=policy(obs))
            actions = dist.sample()
            old_logp = dist.log_prob(actions)
            returns = torch.randn(2048)
            adv = returns - value(obs).squeeze(-1)
        for _ in range(4):
            for idx in torch.randperm(2048).split(64):
                d = torch.distributions.Categorical(logits=policy(obs[idx]))
                ratio = (d.log_prob(actions[idx]) - old_logp[idx]).exp()
                a = adv[idx]
                loss = (-torch.min(ratio * a, ratio.clamp(0.8, 1.2) * a).mean()
                        + 0.5 * (value(obs[idx]).squeeze(-1) - returns[idx]).pow(2).mean()
                        - 0.01 * d.entropy().mean())
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()

    return step


def ddp_bucket_train() -> Step:
    """Data-parallel training's gradient buckets (as DistributedDataParallel reduces them):
    after the backward pass the gradients are flattened, last layer first, into buckets of
    up to 25 MiB, each bucket averaged (the all-reduce's stand-in) and copied back before
    the next is made; a 12-layer MLP of width 1024 on 256 x 1024, AdamW."""
    import torch
    from torch import nn
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(12) for m in (nn.Linear(1024, 1024), nn.GELU())])
    opt = torch.optim.AdamW(model.parameters(), 1e-4)
    x, y = torch.randn(256, 1024), torch.randn(256, 1024)
    params = list(model.parameters())[::-1]
    limit = 25 << 20

    def step() -> None:
        loss = (model(x) - y).pow(2).mean()
        loss.backward()
        bucket, size = [], 0
        for p in params + [None]:
            if p is not None and size + p.numel() * 4 <= limit:
                bucket.append(p)
                size += p.numel() * 4
                continue
            if bucket:
                flat = _flatten_dense_tensors([q.grad for q in bucket]).div_(2)
                for q, g in zip(bucket, _unflatten_dense_tensors(flat, [q.grad for q in bucket])):
                    q.grad.copy_(g)
                del flat
            bucket, size = ([p], p.numel() * 4) if p is not None else ([], 0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


#: (name, what it is, its step) of each, with 1 warm-up and 2 recorded steps
KINDS: List[Workload] = [Workload(name, summary, build, 1, 2) for name, summary, build in [
    ("xlnet_train", "XLNet (small), two-stream attention, 4 x 192, 32 targets, AdamW", xlnet_train),
    ("funnel_train", "Funnel Transformer (small), pooled blocks, MLM, 8 x 256, AdamW",
     funnel_train),
    ("patchtst_train", "PatchTST, 64 series x 21 channels, 512 steps, 96 ahead, AdamW",
     patchtst_train),
    ("marian_train", "Marian (small), translation, 16 x 64 -> 72 tokens, AdamW", marian_train),
    ("vae_decode_serve", "diffusers AutoencoderKL decoder, latents of 16, 24 and 32",
     vae_decode_serve),
    ("ppo_update", "PPO update, 2048-step rollout, 4 epochs of 32 minibatches, Adam", ppo_update),
    ("ddp_bucket_train", "12-layer MLP, gradients reduced in 25 MiB buckets, AdamW",
     ddp_bucket_train),
]]
