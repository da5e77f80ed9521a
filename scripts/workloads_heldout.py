"""The held-out workloads: model steps recorded to test gpumm's pool on kinds of job it was
not tuned on (docs/reserve.md, "Held-out workloads"). Each builds its model from a
configuration in code (random weights: nothing is downloaded) and returns one step of it;
the decoding ones are in scripts/workloads_heldout_decode.py, those of kinds neither has in
scripts/workloads_heldout_kinds.py. ``HELD_OUT`` lists them all,
and scripts/workloads.py lists them with the others for scripts/record_workloads.py.
"""

from __future__ import annotations

from typing import List

from workload_steps import Step, Workload, adamw_step, image_classifier_step
from workloads_heldout_decode import (assisted_decode, gpt2_beam_generate, llama_static_decode,
                                      opt_decode, t5_sample_generate, whisper_generate)
from workloads_heldout_kinds import KINDS


def deberta_train() -> Step:
    """Disentangled attention (content-to-position and position-to-content terms over
    relative positions): transformers' DeBERTa-v2 with a shrunk configuration (6 layers,
    hidden 384, 6 heads, vocabulary 32000), 3-class sequence classification, batch 8 of 256
    tokens, AdamW."""
    import torch
    from transformers import DebertaV2Config, DebertaV2ForSequenceClassification

    torch.manual_seed(0)
    model = DebertaV2ForSequenceClassification(DebertaV2Config(
        hidden_size=384, num_hidden_layers=6, num_attention_heads=6, intermediate_size=1536,
        vocab_size=32000, relative_attention=True, position_buckets=256,
        pos_att_type=["p2c", "c2p"], num_labels=3))
    ids = torch.randint(3, 32000, (8, 256))
    labels = torch.randint(0, 3, (8,))
    return adamw_step(model, lambda: model(input_ids=ids, labels=labels).loss)


def segformer_train() -> Step:
    """Semantic segmentation, a per-pixel loss: transformers' SegFormer (the default
    SegformerConfig: MiT-b0's four stages, 32 to 256 channels) with 19 classes, batch 2 of
    256 x 256 images and their label maps, AdamW."""
    import torch
    from transformers import SegformerConfig, SegformerForSemanticSegmentation

    torch.manual_seed(0)
    model = SegformerForSemanticSegmentation(SegformerConfig(num_labels=19))
    pixels = torch.randn(2, 3, 256, 256)
    labels = torch.randint(0, 19, (2, 256, 256))
    return adamw_step(model, lambda: model(pixel_values=pixels, labels=labels).loss)


def mobilenet_train() -> Step:
    """Depthwise-separable convolutions, many small activations: transformers' MobileNetV2
    (the default MobileNetV2Config: width 1.0) with a 10-class head, batch 16 of 160 x 160
    images, AdamW."""
    import torch
    from transformers import MobileNetV2Config, MobileNetV2ForImageClassification

    torch.manual_seed(0)
    model = MobileNetV2ForImageClassification(MobileNetV2Config(num_labels=10))
    return image_classifier_step(model, 16, 160)


def neox_accum_train() -> Step:
    """Gradient accumulation (gradients kept across four micro-batches, then one optimizer
    step): transformers' GPT-NeoX with a shrunk configuration (6 layers, hidden 512, 8 heads,
    vocabulary 16000, rotary positions), micro-batches of 2 x 256 tokens, AdamW."""
    import torch
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    torch.manual_seed(0)
    model = GPTNeoXForCausalLM(GPTNeoXConfig(
        hidden_size=512, num_hidden_layers=6, num_attention_heads=8, intermediate_size=2048,
        vocab_size=16000, max_position_embeddings=512))
    micro = [torch.randint(0, 16000, (2, 256)) for _ in range(4)]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model.train()

    def step() -> None:
        for ids in micro:
            (model(input_ids=ids, labels=ids).loss / len(micro)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def dcgan_train() -> Step:
    """Two models and two optimizers a step (a GAN): DCGAN's generator (transposed
    convolutions, 100-d noise to 32 x 32 RGB) and discriminator (strided convolutions) in
    plain ``torch.nn``, batch 64, Adam; the discriminator's step on real and detached fake
    images, then the generator's through the discriminator."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    nz = 100

    def up(cin: int, cout: int, stride: int, pad: int) -> list:
        return [nn.ConvTranspose2d(cin, cout, 4, stride, pad, bias=False), nn.BatchNorm2d(cout),
                nn.ReLU(True)]

    def down(cin: int, cout: int, norm: bool) -> list:
        return ([nn.Conv2d(cin, cout, 4, 2, 1, bias=False)] + ([nn.BatchNorm2d(cout)] if norm else [])
                + [nn.LeakyReLU(0.2, True)])

    gen = nn.Sequential(*up(nz, 256, 1, 0), *up(256, 128, 2, 1), *up(128, 64, 2, 1),
                        nn.ConvTranspose2d(64, 3, 4, 2, 1, bias=False), nn.Tanh())
    disc = nn.Sequential(*down(3, 64, False), *down(64, 128, True), *down(128, 256, True),
                         nn.Conv2d(256, 1, 4, 1, 0, bias=False), nn.Flatten(), nn.Sigmoid())
    opt_g = torch.optim.Adam(gen.parameters(), 2e-4)
    opt_d = torch.optim.Adam(disc.parameters(), 2e-4)
    real = torch.randn(64, 3, 32, 32)
    ones, zeros = torch.ones(64, 1), torch.zeros(64, 1)
    bce = nn.BCELoss()

    def step() -> None:
        fake = gen(torch.randn(64, nz, 1, 1))
        loss_d = bce(disc(real), ones) + bce(disc(fake.detach()), zeros)
        opt_d.zero_grad(set_to_none=True)
        loss_d.backward()
        opt_d.step()
        loss_g = bce(disc(fake), ones)
        opt_g.zero_grad(set_to_none=True)
        loss_g.backward()
        opt_g.step()

    return step


def qwen2_partial_train() -> Step:
    """Fine-tuning the top of a frozen model (no gradients, no optimizer state for the rest):
    transformers' Qwen2 with a shrunk configuration (6 layers, hidden 512, 8 heads and 2
    key-value heads, vocabulary 20000), only its last two layers trained, batch 2 of 384
    tokens, AdamW."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(
        hidden_size=512, num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=2,
        intermediate_size=1536, vocab_size=20000, max_position_embeddings=1024))
    for name, p in model.named_parameters():
        p.requires_grad = name.startswith(("model.layers.4.", "model.layers.5."))
    ids = torch.randint(0, 20000, (2, 384))
    # (AdamW keeps no state for a parameter that never has a gradient)
    return adamw_step(model, lambda: model(input_ids=ids, labels=ids).loss)


def bloom_train() -> Step:
    """ALiBi attention (position biases added to the scores, no position embeddings):
    transformers' BLOOM with a shrunk configuration (6 layers, hidden 384, 6 heads,
    vocabulary 16000), causal-LM loss, batch 4 of 192 tokens, AdamW."""
    import torch
    from transformers import BloomConfig, BloomForCausalLM

    torch.manual_seed(0)
    model = BloomForCausalLM(BloomConfig(hidden_size=384, n_layer=6, n_head=6, vocab_size=16000))
    ids = torch.randint(0, 16000, (4, 192))
    return adamw_step(model, lambda: model(input_ids=ids, labels=ids).loss)


def regnet_train() -> Step:
    """Grouped convolutions in stages of growing width: transformers' RegNet (the default
    RegNetConfig) with a 10-class head, batch 8 of 160 x 160 images, AdamW."""
    import torch
    from transformers import RegNetConfig, RegNetForImageClassification

    torch.manual_seed(0)
    model = RegNetForImageClassification(RegNetConfig(num_labels=10))
    return image_classifier_step(model, 8, 160)



def lora_train() -> Step:
    """Low-rank adapters on a frozen model (LoRA: the weights frozen, rank-8 matrices A and B
    beside every attention and MLP projection trained, their output added): transformers'
    Llama with a shrunk configuration (6 layers, hidden 512, 8 heads, vocabulary 16000),
    batch 4 of 256 tokens, AdamW over the adapters only."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    class LoRA(torch.nn.Module):
        def __init__(self, base: torch.nn.Linear, rank: int = 8) -> None:
            super().__init__()
            self.base = base
            self.a = torch.nn.Parameter(torch.randn(rank, base.in_features) / rank)
            self.b = torch.nn.Parameter(torch.zeros(base.out_features, rank))

        def forward(self, x):
            return self.base(x) + (x @ self.a.t()) @ self.b.t() * 2.0

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        hidden_size=512, num_hidden_layers=6, num_attention_heads=8, intermediate_size=1376,
        vocab_size=16000, max_position_embeddings=512))
    for p in model.parameters():
        p.requires_grad = False
    for layer in model.model.layers:
        for parent, names in ((layer.self_attn, ("q_proj", "k_proj", "v_proj", "o_proj")),
                              (layer.mlp, ("gate_proj", "up_proj", "down_proj"))):
            for n in names:
                setattr(parent, n, LoRA(getattr(parent, n)))
    ids = torch.randint(0, 16000, (4, 256))
    return adamw_step(model, lambda: model(input_ids=ids, labels=ids).loss)


def dlrm_train() -> Step:
    """A recommendation model (DLRM): 8 embedding-bag tables of 20,000-160,000 rows x 64 with
    sparse gradients (each step's rows differ, so the gradients' sizes do), a bottom MLP over
    13 dense features, pairwise dot interactions, a top MLP, binary cross-entropy; SparseAdam
    for the tables, Adam for the MLPs; batch 1024 of 16 ids a bag."""
    import torch

    torch.manual_seed(0)
    rows = [20_000 * (1 + i) for i in range(8)]
    tables = torch.nn.ModuleList(
        torch.nn.EmbeddingBag(n, 64, mode="sum", sparse=True) for n in rows)
    bottom = torch.nn.Sequential(torch.nn.Linear(13, 256), torch.nn.ReLU(),
                                 torch.nn.Linear(256, 64), torch.nn.ReLU())
    pairs = 9 * 8 // 2
    top = torch.nn.Sequential(torch.nn.Linear(64 + pairs, 512), torch.nn.ReLU(),
                              torch.nn.Linear(512, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    sparse = torch.optim.SparseAdam(list(tables.parameters()), lr=1e-3)
    dense = torch.optim.Adam(list(bottom.parameters()) + list(top.parameters()), lr=1e-3)
    batch, per_bag = 1024, 16
    iu = torch.triu_indices(9, 9, offset=1)

    def step() -> None:
        x = torch.randn(batch, 13)
        y = torch.randint(0, 2, (batch, 1)).float()
        d = bottom(x)
        embs = [t(torch.randint(0, n, (batch * per_bag,)),
                  torch.arange(0, batch * per_bag, per_bag)) for t, n in zip(tables, rows)]
        z = torch.stack([d] + embs, dim=1)
        inter = torch.bmm(z, z.transpose(1, 2))[:, iu[0], iu[1]]
        logit = top(torch.cat([d, inter], dim=1))
        torch.nn.functional.binary_cross_entropy_with_logits(logit, y).backward()
        sparse.step()
        dense.step()
        sparse.zero_grad(set_to_none=True)
        dense.zero_grad(set_to_none=True)

    return step


def gnn_sampled_train() -> Step:
    """A graph network trained on sampled subgraphs (GraphSAGE-style mean aggregation in plain
    `torch`: messages gathered per edge, summed per node with `index_add_`): each step draws
    512 seed nodes of a random 50,000-node graph and up to 10 neighbours each over two hops,
    so every step's tensors have other sizes; 2 layers of 256, 16 classes, AdamW."""
    import torch

    torch.manual_seed(0)
    nodes, fanout, width = 50_000, 10, 256
    features = torch.randn(nodes, 128)
    labels = torch.randint(0, 16, (nodes,))
    layers = torch.nn.ModuleList([torch.nn.Linear(2 * 128, width),
                                  torch.nn.Linear(2 * width, 16)])
    opt = torch.optim.AdamW(layers.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1)
    # (a step of its own, not `adamw_step`: the sampled tensors stay live through the
    # backward pass and the optimizer step, as recorded; through `adamw_step`'s loss closure
    # they would not, and the peak live reads 11.7 MiB instead of 15.6)

    def hop(seeds):
        """Up to `fanout` random neighbours of each seed (a random graph: drawn, not stored)."""
        deg = torch.randint(1, fanout + 1, (len(seeds),), generator=gen)
        dst = torch.repeat_interleave(torch.arange(len(seeds)), deg)
        src = torch.randint(0, nodes, (int(deg.sum()),), generator=gen)
        return src, dst, deg

    def step() -> None:
        seeds = torch.randint(0, nodes, (512,), generator=gen)
        src1, dst1, deg1 = hop(seeds)
        src2, dst2, deg2 = hop(src1)
        # layer 1 on the first hop's nodes, layer 2 on the seeds
        h1_self = features[src1]
        agg1 = torch.zeros(len(src1), 128).index_add_(0, dst2, features[src2])
        h1 = torch.relu(layers[0](torch.cat([h1_self, agg1 / deg2[:, None]], 1)))
        agg0 = torch.zeros(len(seeds), width).index_add_(0, dst1, h1)
        h0 = torch.relu(layers[0](torch.cat([features[seeds], features[seeds]], 1)))
        out = layers[1](torch.cat([h0, agg0 / deg1[:, None]], 1))
        torch.nn.functional.cross_entropy(out, labels[seeds]).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def gru_packed_varlen_train() -> Step:
    """Variable-length sequences packed per step (`pack_padded_sequence`): a 2-layer
    bidirectional GRU tagger in plain `torch.nn` (embedding 20,000 × 256, hidden 384, 24
    tags), each step a batch of 16 sequences whose lengths are drawn anew (8-200 tokens), so
    every step's packed tensors have other sizes; cross-entropy over the real tokens, AdamW."""
    import torch
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    torch.manual_seed(0)
    emb = torch.nn.Embedding(20_000, 256)
    gru = torch.nn.GRU(256, 384, num_layers=2, bidirectional=True, batch_first=True)
    head = torch.nn.Linear(2 * 384, 24)
    params = list(emb.parameters()) + list(gru.parameters()) + list(head.parameters())
    opt = torch.optim.AdamW(params, lr=1e-3)
    gen = torch.Generator().manual_seed(1)
    # (a step of its own, as `gnn_sampled_train`'s: through `adamw_step` the packed
    # tensors would die before the backward pass, and the peak live read 111.1 MiB, not 120.2)

    def step() -> None:
        lengths = torch.randint(8, 201, (16,), generator=gen).sort(descending=True).values
        ids = torch.randint(0, 20_000, (16, int(lengths[0])), generator=gen)
        tags = torch.randint(0, 24, (16, int(lengths[0])), generator=gen)
        packed = pack_padded_sequence(emb(ids), lengths, batch_first=True)
        out, _ = pad_packed_sequence(gru(packed)[0], batch_first=True)
        mask = torch.arange(out.shape[1])[None, :] < lengths[:, None]
        loss = torch.nn.functional.cross_entropy(head(out[mask]), tags[mask])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def efficientnet_multiscale_train() -> Step:
    """Multi-scale training (each step's images drawn at a new side, as detectors and YOLO
    train): transformers' EfficientNet at B0's width and depth (depthwise convolutions,
    squeeze-and-excitation), 10 classes, batch 8 at a side drawn from 128-256 in steps of
    32 each step, so every step's activations have other sizes; AdamW."""
    import torch
    from transformers import EfficientNetConfig, EfficientNetForImageClassification

    torch.manual_seed(0)
    model = EfficientNetForImageClassification(EfficientNetConfig(
        width_coefficient=1.0, depth_coefficient=1.0, hidden_dim=1280, image_size=224,
        num_labels=10))
    gen = torch.Generator().manual_seed(1)
    labels = torch.randint(0, 10, (8,))
    side = {"now": 224}

    def loss():
        return model(pixel_values=torch.randn(8, 3, side["now"], side["now"], generator=gen),
                     labels=labels).loss

    train = adamw_step(model, loss)

    def step() -> None:
        side["now"] = 128 + 32 * int(torch.randint(0, 5, (1,), generator=gen))
        train()

    return step




def vit_mae_pretrain() -> Step:
    """Masked-autoencoder pretraining (each step masks a new random 75 % of the patches, so
    the encoder sees a gathered subset and the decoder restores the full sequence):
    transformers' ViTMAE with a shrunk configuration (6 encoder layers of hidden 384, 6
    heads; a 4-layer decoder of 256), batch 16 of 224 x 224 images, AdamW."""
    import torch
    from transformers import ViTMAEConfig, ViTMAEForPreTraining

    torch.manual_seed(0)
    model = ViTMAEForPreTraining(ViTMAEConfig(
        hidden_size=384, num_hidden_layers=6, num_attention_heads=6, intermediate_size=1536,
        decoder_hidden_size=256, decoder_num_hidden_layers=4, decoder_num_attention_heads=8,
        decoder_intermediate_size=1024))
    pixels = torch.randn(16, 3, 224, 224)
    return adamw_step(model, lambda: model(pixel_values=pixels).loss)




def dit_train() -> Step:
    """A diffusion transformer's denoising step (the noise of a random timestep predicted for
    each latent, mean squared error): diffusers' DiTTransformer2DModel with a shrunk
    configuration (8 layers, 6 heads of 64, patch 2, class-conditioned adaptive layer
    norm), batch 8 of 4 x 32 x 32 latents, AdamW."""
    import torch
    from diffusers import DiTTransformer2DModel

    torch.manual_seed(0)
    model = DiTTransformer2DModel(
        num_attention_heads=6, attention_head_dim=64, in_channels=4, out_channels=4,
        num_layers=8, sample_size=32, patch_size=2, num_embeds_ada_norm=1000)
    latents = torch.randn(8, 4, 32, 32)
    noise = torch.randn_like(latents)
    steps = torch.randint(0, 1000, (8,))
    classes = torch.randint(0, 1000, (8,))

    def loss():
        pred = model(latents + noise, timestep=steps, class_labels=classes).sample
        return torch.nn.functional.mse_loss(pred, noise)

    return adamw_step(model, loss)


def longformer_train() -> Step:
    """Sliding-window attention over long sequences (each token attends to a window of 128
    around it, computed in overlapping chunks, and the first token globally):
    transformers' Longformer with a shrunk configuration (4 layers, hidden 256, 4 heads,
    vocabulary 30522), masked-language-model loss, batch 2 of 2048 tokens, AdamW."""
    import torch
    from transformers import LongformerConfig, LongformerForMaskedLM

    torch.manual_seed(0)
    model = LongformerForMaskedLM(LongformerConfig(
        hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024,
        attention_window=128, max_position_embeddings=2050, vocab_size=30522))
    ids = torch.randint(5, 30522, (2, 2048))
    globals_ = torch.zeros_like(ids)
    globals_[:, 0] = 1
    return adamw_step(model, lambda: model(input_ids=ids, global_attention_mask=globals_,
                                           labels=ids).loss)


def videomae_train() -> Step:
    """Video classification over space-time patches (16 frames in tubelets of 2, so the
    attention runs over 8 x 10 x 10 = 800 tokens a clip): transformers' VideoMAE with a
    shrunk configuration (6 layers, hidden 384, 6 heads), batch 4 of 16 x 160 x 160 clips,
    AdamW."""
    import torch
    from transformers import VideoMAEConfig, VideoMAEForVideoClassification

    torch.manual_seed(0)
    model = VideoMAEForVideoClassification(VideoMAEConfig(
        image_size=160, patch_size=16, num_frames=16, tubelet_size=2, hidden_size=384,
        num_hidden_layers=6, num_attention_heads=6, intermediate_size=1536, num_labels=10))
    clips = torch.randn(4, 16, 3, 160, 160)
    labels = torch.randint(0, 10, (4,))
    return adamw_step(model, lambda: model(pixel_values=clips, labels=labels).loss)


def electra_pretrain() -> Step:
    """Replaced-token detection (ELECTRA: a small generator fills the masked positions by
    sampling from its logits, a larger discriminator tells which tokens were replaced; both
    trained in one step): transformers' Electra generator (4 layers, hidden 128) and
    discriminator (6 layers, hidden 256), vocabulary 16000, batch 16 of 256 tokens, 15 %
    masked, AdamW over both."""
    import torch
    from transformers import ElectraConfig, ElectraForMaskedLM, ElectraForPreTraining

    torch.manual_seed(0)

    def config(hidden: int, layers: int, heads: int):
        return ElectraConfig(vocab_size=16000, embedding_size=128, hidden_size=hidden,
                             num_hidden_layers=layers, num_attention_heads=heads,
                             intermediate_size=4 * hidden)

    both = torch.nn.ModuleDict({"gen": ElectraForMaskedLM(config(128, 4, 2)),
                                "disc": ElectraForPreTraining(config(256, 6, 4))})
    ids = torch.randint(5, 16000, (16, 256))
    mask = torch.rand(ids.shape) < 0.15

    def loss():
        out = both["gen"](input_ids=ids.masked_fill(mask, 4), labels=ids.masked_fill(~mask, -100))
        sampled = torch.distributions.Categorical(logits=out.logits.detach()).sample()
        fake = torch.where(mask, sampled, ids)
        return out.loss + 50 * both["disc"](input_ids=fake, labels=(fake != ids).long()).loss

    return adamw_step(both, loss)


def llama_ckpt_long_train() -> Step:
    """A long context with activation checkpointing (each layer's activations recomputed in
    the backward pass, so a layer's worth lives at a time over 2,048 tokens): transformers'
    Llama with a shrunk configuration (4 layers, hidden 256, 4 heads, 2 key/value heads,
    vocabulary 8000), one sequence of 2,048 tokens, AdamW."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=8000, max_position_embeddings=2048))
    model.gradient_checkpointing_enable()
    ids = torch.randint(0, 8000, (1, 2048))
    return adamw_step(model, lambda: model(input_ids=ids, labels=ids).loss)


#: In the order they were recorded: the first four after the size cache stopped changing
#: placements (docs/reserve.md, "Held-out workloads"), the next five after the policy of
#: issue 27's first rounds, then the others as the rules of docs/reserve.md came; the last
#: four after "Heap blocks from both ends".
HELD_OUT: List[Workload] = [
    Workload("deberta_train", "DeBERTa-v2 (small), 8 x 256 tokens, AdamW", deberta_train, 1, 2),
    Workload("segformer_train", "SegFormer (MiT-b0), 2 x 256 x 256, per-pixel loss, AdamW",
             segformer_train, 1, 2),
    Workload("mobilenet_train", "MobileNetV2, 16 x 160 x 160, AdamW", mobilenet_train, 1, 2),
    Workload("neox_accum_train", "GPT-NeoX (small), 4 accumulated micro-batches, AdamW",
             neox_accum_train, 1, 2),
    Workload("dcgan_train", "DCGAN, generator and discriminator steps, 64 x 32 x 32, Adam",
             dcgan_train, 1, 2),
    Workload("qwen2_partial_train", "Qwen2 (small), last 2 of 6 layers trained, 2 x 384, AdamW",
             qwen2_partial_train, 1, 2),
    Workload("bloom_train", "BLOOM (small, ALiBi), 4 x 192 tokens, AdamW", bloom_train, 1, 2),
    Workload("regnet_train", "RegNet, 8 x 160 x 160, AdamW", regnet_train, 1, 2),
    Workload("opt_decode", "OPT (small), greedy generate, 3 x 40 + 48 tokens, KV cache",
             opt_decode, 1, 1),
    Workload("lora_train", "Llama (small) frozen, rank-8 LoRA adapters, 4 x 256 tokens, AdamW",
             lora_train, 1, 2),
    Workload("dlrm_train", "DLRM, 8 sparse embedding-bag tables, batch 1024, SparseAdam + Adam",
             dlrm_train, 1, 2),
    Workload("gnn_sampled_train", "GraphSAGE-style network, 2-hop sampled subgraphs, AdamW",
             gnn_sampled_train, 1, 4),
    Workload("gru_packed_varlen_train", "bidirectional GRU tagger, packed sequences of new lengths "
             "each step, AdamW", gru_packed_varlen_train, 1, 4),
    Workload("efficientnet_multiscale_train", "EfficientNet-B0, 8 images at a new side (128-256) "
             "each step, AdamW", efficientnet_multiscale_train, 1, 4),
    Workload("llama_static_decode", "Llama (small), static KV cache, 4 left-padded prompts of "
             "24-96 + 64 tokens", llama_static_decode, 1, 1),
    Workload("t5_sample_generate", "T5-small, nucleus-sampled generate, 4 x 256 + 48 tokens",
             t5_sample_generate, 1, 1),
    Workload("vit_mae_pretrain", "ViTMAE (small), 75 % of patches masked anew each step, AdamW",
             vit_mae_pretrain, 1, 2),
    Workload("whisper_generate", "Whisper (small), greedy generate, 2 x 30 s + 48 tokens",
             whisper_generate, 1, 1),
    Workload("assisted_decode", "Llama (small) with a 2-layer draft model, speculative "
             "generate, 64 + 64 tokens", assisted_decode, 1, 1),
    Workload("dit_train", "DiT (small), denoising step, 8 x 4 x 32 x 32 latents, AdamW",
             dit_train, 1, 2),
    Workload("longformer_train", "Longformer (small), window 128, 2 x 2048 tokens, MLM, AdamW",
             longformer_train, 1, 2),
    Workload("videomae_train", "VideoMAE (small), 4 clips of 16 x 160 x 160, AdamW",
             videomae_train, 1, 2),
    Workload("electra_pretrain", "ELECTRA generator and discriminator, 16 x 256 tokens, AdamW",
             electra_pretrain, 1, 2),
    Workload("llama_ckpt_long_train", "Llama (small), activation checkpointing, 1 x 2048 "
             "tokens, AdamW", llama_ckpt_long_train, 1, 2),
    Workload("gpt2_beam_generate", "GPT-2 (small), beam search (4 beams), 4 x 64 + 64 tokens",
             gpt2_beam_generate, 1, 1),
] + KINDS
