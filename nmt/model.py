"""Bidirectional-RNN encoder, Bahdanau and Luong attention decoders, and the Seq2Seq model.

`Seq2Seq.encode` runs once per batch of sentences and returns an `Encoded` (states, projected
attention keys, mask, initial decoder state); `Seq2Seq.step` advances every sentence by one
target token for greedy and beam search; `Seq2Seq.forward` is the teacher-forced pass used in
training. `forward` and `step` share their per-step code (`_step_core`), and the output layer
runs once over all target positions. `build_model` is the only place that reads ModelConfig.

Shape legend: B batch, S source length, T target length, E embedding size, He encoder hidden
size per direction, Hd decoder hidden size, L layers, V vocabulary, D pre-output size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from nmt.attention import Attention, build_attention
from nmt.config import ModelConfig
from nmt.recurrence import decoder_loop, scorer_of

RNNS: dict[str, type[nn.GRU] | type[nn.LSTM]] = {"gru": nn.GRU, "lstm": nn.LSTM}

RNNState = Tensor | tuple[Tensor, Tensor]


@dataclass
class Encoded:
    """What the decoder attends to and starts from; computed once per sentence."""

    states: Tensor  # (B, S, 2He) encoder outputs, the attention values; zeros on padding
    keys: Tensor  # (B, S, Dp) attention.project_keys(states)
    mask: Tensor  # (B, S) bool, True = real token
    final: Tensor  # (Ld, B, Hd) the decoder's initial hidden state: bridged, or zeros
    final_cell: Tensor | None = None  # (Ld, B, Hd) the same for the LSTM cell state

    def select(self, index: Tensor) -> Encoded:
        """The sentences at `index` (B',), in that order, repeats allowed: beam search's view."""
        return Encoded(
            states=self.states.index_select(0, index),
            keys=self.keys.index_select(0, index),
            mask=self.mask.index_select(0, index),
            final=self.final.index_select(1, index),
            final_cell=None if self.final_cell is None else self.final_cell.index_select(1, index),
        )


@dataclass
class DecoderState:
    """Everything one decoder step carries to the next."""

    hidden: Tensor  # (Ld, B, Hd)
    cell: Tensor | None = None  # (Ld, B, Hd) LSTM only
    feed: Tensor | None = None  # (B, Hd) Luong input feeding: the previous attentional output

    def select(self, index: Tensor) -> DecoderState:
        """The hypotheses at `index` (B',), in that order: beam search reorders with it."""
        return DecoderState(
            hidden=self.hidden.index_select(1, index),
            cell=None if self.cell is None else self.cell.index_select(1, index),
            feed=None if self.feed is None else self.feed.index_select(0, index),
        )

    def rnn_state(self) -> RNNState:
        """The `hx` argument of nn.GRU / nn.LSTM."""
        return self.hidden if self.cell is None else (self.hidden, self.cell)


def _split_rnn_state(state: RNNState) -> tuple[Tensor, Tensor | None]:
    """nn.GRU returns h, nn.LSTM returns (h, c): give both as (h, c or None)."""
    return state if isinstance(state, tuple) else (state, None)


def _rnn(
    cell: str,
    *,
    input_size: int,
    hidden_size: int,
    num_layers: int,
    dropout: float,
    bidirectional: bool = False,
) -> nn.GRU | nn.LSTM:
    # nn.GRU warns when given inter-layer dropout with a single layer, where it does nothing.
    return RNNS[cell](
        input_size,
        hidden_size,
        num_layers=num_layers,
        batch_first=True,
        bidirectional=bidirectional,
        dropout=dropout if num_layers > 1 else 0.0,
    )


def _fused_loop(
    decoder: BahdanauDecoder | LuongDecoder, emb: Tensor, state: DecoderState, enc: Encoded
) -> tuple[Tensor, ...] | None:
    """The teacher-forced loop by `nmt.recurrence` (same numbers, one weight-gradient product
    per weight), or None where it does not apply: LSTM, several layers, an unknown scorer."""
    rnn, scorer = decoder.rnn, scorer_of(decoder.attention)
    if not decoder.fused or not isinstance(rnn, nn.GRU) or rnn.num_layers != 1 or scorer is None:
        return None
    size = emb.size(-1)
    w_ih, w_hh, b_ih, b_hh = rnn.all_weights[0]  # w_ih (3Hd, E + R): the embedding's first
    gi_emb = nn.functional.linear(emb, w_ih[:, :size], b_ih)  # (B, T, 3Hd)
    return decoder_loop(
        gi_emb=gi_emb,
        h0=state.hidden[0],
        w_ir=w_ih[:, size:],
        w_hh=w_hh,
        b_hh=b_hh,
        w_c=decoder.combine.weight if isinstance(decoder, LuongDecoder) else None,
        scorer=scorer,
        keys=enc.keys,
        values=enc.states,
        mask=enc.mask,
    )


class Encoder(nn.Module):
    """Bidirectional RNN over the embedded source, packed so that padding never enters it."""

    def __init__(
        self, *, cell: str, input_size: int, hidden_size: int, num_layers: int, dropout: float
    ) -> None:
        super().__init__()
        self.num_layers = num_layers
        self.output_size = 2 * hidden_size
        self.rnn = _rnn(
            cell,
            input_size=input_size,
            hidden_size=hidden_size,
            num_layers=num_layers,
            dropout=dropout,
            bidirectional=True,
        )

    def forward(self, emb: Tensor, lens: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        """Encode embedded sources.

        emb: (B, S, E); lens: (B,) int64 real lengths (moved to the CPU, as packing needs).
        Returns states (B, S, 2He) with zeros on padding, and the final hidden state and
        (LSTM) cell state per layer, forward and backward concatenated: (Le, B, 2He).
        """
        packed = pack_padded_sequence(emb, lens.cpu(), batch_first=True, enforce_sorted=False)
        out, final = self.rnn(packed)
        states, _ = pad_packed_sequence(out, batch_first=True, total_length=emb.size(1))
        h, c = _split_rnn_state(final)
        return states, self._merge_directions(h), None if c is None else self._merge_directions(c)

    def _merge_directions(self, h: Tensor) -> Tensor:
        """(2 Le, B, He), directions interleaved per layer -> (Le, B, 2He)."""
        h = h.view(self.num_layers, 2, h.size(1), h.size(2))  # (Le, 2, B, He)
        return torch.cat([h[:, 0], h[:, 1]], dim=-1)  # (Le, B, 2He)


class Bridge(nn.Module):
    """Initial decoder state from the encoder's final states, per layer: tanh(W [h_fwd; h_bwd])
    (`linear`) or [h_fwd; h_bwd] itself (`copy`, OpenNMT-py's default: needs Hd = 2He, which
    the config checks).

    Encoder layer i starts decoder layer i when the layer counts match; otherwise the top
    encoder layer starts every decoder layer. One W serves all layers; an LSTM's cell state
    gets its own W.
    """

    def __init__(
        self,
        *,
        enc_size: int,
        dec_hidden: int,
        enc_layers: int,
        dec_layers: int,
        lstm: bool,
        copy: bool = False,
    ) -> None:
        super().__init__()
        self.dec_layers = dec_layers
        self.layerwise = enc_layers == dec_layers
        self.hidden = None if copy else nn.Linear(enc_size, dec_hidden)
        self.cell = nn.Linear(enc_size, dec_hidden) if lstm and not copy else None

    def forward(self, final: Tensor, final_cell: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """(Le, B, 2He) final states -> (Ld, B, Hd) initial decoder hidden and cell states."""
        if self.hidden is None:  # copy
            c = None if final_cell is None else self._layers(final_cell)
            return self._layers(final), c  # (Ld, B, Hd)
        h = torch.tanh(self.hidden(self._layers(final)))  # (Ld, B, Hd)
        if self.cell is None or final_cell is None:
            return h, None
        return h, torch.tanh(self.cell(self._layers(final_cell)))  # (Ld, B, Hd)

    def _layers(self, final: Tensor) -> Tensor:
        return final if self.layerwise else final[-1:].expand(self.dec_layers, -1, -1)


class BahdanauDecoder(nn.Module):
    """Bahdanau et al. 2015: attend with s_{t-1}, then the RNN reads [y_{t-1}; c_t].

    Pre-output ("deep output", with tanh in place of maxout): tanh(W [s_t; c_t; y_{t-1}]),
    computed once over all steps after the loop in `forward`.
    """

    fused = True  # teacher forcing by nmt.recurrence where it applies; False: step by step

    def __init__(
        self,
        *,
        cell: str,
        emb_size: int,
        context_size: int,
        hidden_size: int,
        num_layers: int,
        dropout: float,
        attention: Attention,
    ) -> None:
        super().__init__()
        self.attention = attention
        self.output_size = hidden_size
        self.rnn = _rnn(
            cell,
            input_size=emb_size + context_size,
            hidden_size=hidden_size,
            num_layers=num_layers,
            dropout=dropout,
        )
        self.pre_output = nn.Linear(hidden_size + context_size + emb_size, hidden_size)

    def init_state(self, enc: Encoded) -> DecoderState:
        return DecoderState(hidden=enc.final, cell=enc.final_cell)

    def _step_core(
        self, emb: Tensor, state: DecoderState, enc: Encoded
    ) -> tuple[Tensor, Tensor, DecoderState, Tensor]:
        """One step: emb (B, E) -> new top state s_t (B, Hd), context c_t (B, 2He), state,
        attention (B, S)."""
        query = state.hidden[-1]  # (B, Hd) s_{t-1}, top layer
        context, weights = self.attention(query, enc.keys, enc.states, enc.mask)
        rnn_in = torch.cat([emb, context], dim=-1).unsqueeze(1)  # (B, 1, E + 2He)
        out, new = self.rnn(rnn_in, state.rnn_state())
        h, c = _split_rnn_state(new)
        return out.squeeze(1), context, DecoderState(hidden=h, cell=c), weights

    def _pre_output(self, s: Tensor, context: Tensor, emb: Tensor) -> Tensor:
        """(B, [T,] Hd), (B, [T,] 2He), (B, [T,] E) -> (B, [T,] Hd)."""
        return torch.tanh(self.pre_output(torch.cat([s, context, emb], dim=-1)))

    def step(
        self, emb: Tensor, state: DecoderState, enc: Encoded
    ) -> tuple[Tensor, DecoderState, Tensor]:
        """emb (B, E) embedded y_{t-1} -> pre-output (B, Hd), new state, attention (B, S)."""
        s, context, state, weights = self._step_core(emb, state, enc)
        return self._pre_output(s, context, emb), state, weights

    def forward(self, emb: Tensor, state: DecoderState, enc: Encoded) -> tuple[Tensor, Tensor]:
        """Teacher forcing: emb (B, T, E) -> pre-outputs (B, T, Hd), attention (B, T, S)."""
        fused = _fused_loop(self, emb, state, enc)
        if fused is not None:
            s_all, c_all, w_all = fused  # (B, T, Hd), (B, T, 2He), (B, T, S)
            return self._pre_output(s_all, c_all, emb), w_all
        states, contexts, weights = [], [], []
        for t in range(emb.size(1)):
            s, context, state, w = self._step_core(emb[:, t], state, enc)
            states.append(s)
            contexts.append(context)
            weights.append(w)
        s_all = torch.stack(states, dim=1)  # (B, T, Hd)
        c_all = torch.stack(contexts, dim=1)  # (B, T, 2He)
        return self._pre_output(s_all, c_all, emb), torch.stack(weights, dim=1)


class LuongDecoder(nn.Module):
    """Luong et al. 2015: the RNN steps first, attends with s_t, emits h̃_t = tanh(W_c [c_t; s_t]).

    With input feeding, h̃_{t-1} joins the next RNN input, so the decoder runs step by step.
    Without it the RNN reads the whole target in one call and attention for all steps is one
    batched product (the training fast path); `step` gives the same numbers one step at a time.
    """

    fused = True  # input feeding by nmt.recurrence where it applies; False: step by step

    def __init__(
        self,
        *,
        cell: str,
        emb_size: int,
        context_size: int,
        hidden_size: int,
        num_layers: int,
        dropout: float,
        attention: Attention,
        input_feeding: bool,
    ) -> None:
        super().__init__()
        self.attention = attention
        self.output_size = hidden_size
        self.input_feeding = input_feeding
        self.rnn = _rnn(
            cell,
            input_size=emb_size + (hidden_size if input_feeding else 0),
            hidden_size=hidden_size,
            num_layers=num_layers,
            dropout=dropout,
        )
        # Luong's W_c has no bias.
        self.combine = nn.Linear(context_size + hidden_size, hidden_size, bias=False)

    def init_state(self, enc: Encoded) -> DecoderState:
        feed = enc.final.new_zeros(enc.final.shape[1:]) if self.input_feeding else None  # (B, Hd)
        return DecoderState(hidden=enc.final, cell=enc.final_cell, feed=feed)

    def _attend(self, s: Tensor, enc: Encoded) -> tuple[Tensor, Tensor]:
        """s (B, [T,] Hd) -> h̃ (B, [T,] Hd), attention (B, [T,] S)."""
        context, weights = self.attention(s, enc.keys, enc.states, enc.mask)
        return torch.tanh(self.combine(torch.cat([context, s], dim=-1))), weights

    def _step_core(
        self, emb: Tensor, state: DecoderState, enc: Encoded
    ) -> tuple[Tensor, DecoderState, Tensor]:
        """One step: emb (B, E) -> h̃_t (B, Hd), new state, attention (B, S)."""
        rnn_in = emb if state.feed is None else torch.cat([emb, state.feed], dim=-1)
        out, new = self.rnn(rnn_in.unsqueeze(1), state.rnn_state())  # out (B, 1, Hd)
        h, c = _split_rnn_state(new)
        h_tilde, weights = self._attend(out.squeeze(1), enc)
        feed = h_tilde if self.input_feeding else None
        return h_tilde, DecoderState(hidden=h, cell=c, feed=feed), weights

    def step(
        self, emb: Tensor, state: DecoderState, enc: Encoded
    ) -> tuple[Tensor, DecoderState, Tensor]:
        """emb (B, E) embedded y_{t-1} -> pre-output h̃_t (B, Hd), new state, attention (B, S)."""
        return self._step_core(emb, state, enc)

    def forward(self, emb: Tensor, state: DecoderState, enc: Encoded) -> tuple[Tensor, Tensor]:
        """Teacher forcing: emb (B, T, E) -> pre-outputs h̃ (B, T, Hd), attention (B, T, S)."""
        if not self.input_feeding:
            out, _ = self.rnn(emb, state.rnn_state())  # (B, T, Hd)
            return self._attend(out, enc)
        fused = _fused_loop(self, emb, state, enc)
        if fused is not None:
            return fused[0], fused[1]  # (B, T, Hd), (B, T, S)
        outputs, weights = [], []
        for t in range(emb.size(1)):
            h_tilde, state, w = self._step_core(emb[:, t], state, enc)
            outputs.append(h_tilde)
            weights.append(w)
        return torch.stack(outputs, dim=1), torch.stack(weights, dim=1)  # (B, T, Hd), (B, T, S)


Decoder = BahdanauDecoder | LuongDecoder


class Generator(nn.Module):
    """Output layer: pre-output states -> vocabulary logits, optionally tied to an embedding.

    Tying makes the output weight the target embedding matrix (V, E), so the pre-output size
    D must equal E: when it does not, a bias-free Linear D -> E comes first.
    """

    def __init__(
        self, *, input_size: int, vocab_size: int, dropout: float, tie_to: nn.Embedding | None
    ) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        size = input_size if tie_to is None else tie_to.embedding_dim
        self.proj = nn.Linear(input_size, size, bias=False) if size != input_size else None
        self.out = nn.Linear(size, vocab_size)
        if tie_to is not None:
            self.out.weight = tie_to.weight

    def forward(self, x: Tensor) -> Tensor:
        """(B, [T,] D) -> logits (B, [T,] V)."""
        x = self.dropout(x)
        if self.proj is not None:
            x = self.proj(x)  # (B, [T,] E)
        return self.out(x)


class Seq2Seq(nn.Module):
    """Attention-based encoder-decoder: `encode` once, then `step` or teacher-forced `forward`."""

    def __init__(
        self,
        *,
        src_embed: nn.Embedding,
        tgt_embed: nn.Embedding,
        encoder: Encoder,
        bridge: Bridge | None,
        decoder: Decoder,
        generator: Generator,
        dropout: float,
        pad_id: int,
    ) -> None:
        super().__init__()
        self.src_embed = src_embed
        self.tgt_embed = tgt_embed
        self.encoder = encoder
        self.bridge = bridge  # None: the decoder starts from zeros
        self.decoder = decoder
        self.generator = generator
        self.dropout = nn.Dropout(dropout)
        self.pad_id = pad_id
        self.src_vocab_size = src_embed.num_embeddings
        self.tgt_vocab_size = tgt_embed.num_embeddings
        self._dec_shape = (decoder.rnn.num_layers, decoder.rnn.hidden_size)

    def encode(self, src: Tensor, src_lens: Tensor) -> Encoded:
        """src (B, S) int64 ending in EOS, src_lens (B,) int64 on the CPU -> Encoded."""
        emb = self.dropout(self.src_embed(src))  # (B, S, E)
        states, final, final_cell = self.encoder(emb, src_lens)
        # From the ids, not from src_lens: those live on the CPU, and copying them to a GPU
        # would block on every forward pass. Real tokens are never PAD.
        mask = src != self.pad_id  # (B, S)
        if self.bridge is not None:
            h0, c0 = self.bridge(final, final_cell)
        else:
            layers, hidden = self._dec_shape
            h0 = states.new_zeros(layers, src.size(0), hidden)  # (Ld, B, Hd)
            c0 = None if final_cell is None else torch.zeros_like(h0)
        keys = self.decoder.attention.project_keys(states)  # (B, S, Dp)
        return Encoded(states=states, keys=keys, mask=mask, final=h0, final_cell=c0)

    def init_state(self, enc: Encoded) -> DecoderState:
        return self.decoder.init_state(enc)

    def step(
        self, prev: Tensor, state: DecoderState, enc: Encoded
    ) -> tuple[Tensor, DecoderState, Tensor]:
        """prev (B,) int64 previous target token -> logits (B, V), new state, attention (B, S)."""
        emb = self.dropout(self.tgt_embed(prev))  # (B, E)
        pre, state, weights = self.decoder.step(emb, state, enc)
        return self.generator(pre), state, weights

    def forward(self, src: Tensor, src_lens: Tensor, tgt_in: Tensor) -> tuple[Tensor, Tensor]:
        """Teacher forcing.

        src (B, S) int64, src_lens (B,) int64 CPU, tgt_in (B, T) int64 starting with BOS.
        Returns logits (B, T, V) and attention weights (B, T, S) (float32, zero on padding).
        """
        enc = self.encode(src, src_lens)
        emb = self.dropout(self.tgt_embed(tgt_in))  # (B, T, E)
        pre, weights = self.decoder(emb, self.init_state(enc), enc)  # (B, T, D), (B, T, S)
        return self.generator(pre), weights


def _embedding(vocab_size: int, size: int, pad_id: int) -> nn.Embedding:
    """An embedding with N(0, 1/E) init: unit-variance rows would give huge tied logits."""
    emb = nn.Embedding(vocab_size, size, padding_idx=pad_id)
    nn.init.normal_(emb.weight, std=size**-0.5)
    with torch.no_grad():
        emb.weight[pad_id].zero_()
    return emb


def build_model(
    cfg: ModelConfig,
    *,
    src_vocab_size: int,
    tgt_vocab_size: int,
    pad_id: int = 0,
    shared_vocab: bool,
) -> Seq2Seq:
    """The Seq2Seq model that `cfg` describes; the only place that reads ModelConfig."""
    if cfg.share_embeddings and not (shared_vocab and src_vocab_size == tgt_vocab_size):
        raise ValueError(
            "model.share_embeddings: needs one joint vocabulary (tokenizer.joint: true), "
            f"got source/target vocabularies of {src_vocab_size}/{tgt_vocab_size} "
            f"(joint: {shared_vocab})"
        )
    tgt_embed = _embedding(tgt_vocab_size, cfg.emb_size, pad_id)
    src_embed = (
        tgt_embed if cfg.share_embeddings else _embedding(src_vocab_size, cfg.emb_size, pad_id)
    )
    encoder = Encoder(
        cell=cfg.cell,
        input_size=cfg.emb_size,
        hidden_size=cfg.enc_hidden,
        num_layers=cfg.enc_layers,
        dropout=cfg.dropout,
    )
    bridge = None
    if cfg.bridge != "none":
        bridge = Bridge(
            enc_size=encoder.output_size,
            dec_hidden=cfg.dec_hidden,
            enc_layers=cfg.enc_layers,
            dec_layers=cfg.dec_layers,
            lstm=cfg.cell == "lstm",
            copy=cfg.bridge == "copy",
        )
    attention = build_attention(
        cfg.attention,
        query_size=cfg.dec_hidden,
        key_size=encoder.output_size,
        hidden_size=cfg.attention_size,
    )
    decoder: Decoder
    if cfg.decoder == "bahdanau":
        decoder = BahdanauDecoder(
            cell=cfg.cell,
            emb_size=cfg.emb_size,
            context_size=encoder.output_size,
            hidden_size=cfg.dec_hidden,
            num_layers=cfg.dec_layers,
            dropout=cfg.dropout,
            attention=attention,
        )
    else:
        decoder = LuongDecoder(
            cell=cfg.cell,
            emb_size=cfg.emb_size,
            context_size=encoder.output_size,
            hidden_size=cfg.dec_hidden,
            num_layers=cfg.dec_layers,
            dropout=cfg.dropout,
            attention=attention,
            input_feeding=cfg.input_feeding,
        )
    generator = Generator(
        input_size=decoder.output_size,
        vocab_size=tgt_vocab_size,
        dropout=cfg.dropout,
        tie_to=tgt_embed if cfg.tie_embeddings else None,
    )
    model = Seq2Seq(
        src_embed=src_embed,
        tgt_embed=tgt_embed,
        encoder=encoder,
        bridge=bridge,
        decoder=decoder,
        generator=generator,
        dropout=cfg.dropout,
        pad_id=pad_id,
    )
    if cfg.init == "uniform":
        with torch.no_grad():
            for p in model.parameters():
                p.uniform_(-cfg.init_range, cfg.init_range)
            for emb in {src_embed, tgt_embed}:
                emb.weight[pad_id].zero_()  # padding stays a zero vector
    return model
