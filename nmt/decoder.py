"""The attention decoders, Bahdanau's and Luong's, and what they read and carry.

`Encoded` is what the encoder hands over, computed once per batch of sentences;
`DecoderState` what one decoder step carries to the next. Each decoder has one `step` (greedy
and beam search) and a teacher-forced `forward` (training) sharing their per-step code; the
teacher-forced loop runs in `nmt.recurrence` where it applies (`fused_loop`).

Shape legend: B batch, S source length, T target length, E embedding size, He encoder hidden
size per direction, Hd decoder hidden size, L layers, D pre-output size.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor, nn

from nmt import onednn, vml
from nmt.attention import Attention
from nmt.dropout import Dropout
from nmt.encoder_loop import decoder_applies, decoder_gru
from nmt.recurrence import decoder_loop, scorer_of
from nmt.runtime import autocast_off

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
    src: Tensor | None = None  # (B, S) what copy attention copies: source ids (shortlist: columns)
    # the batch's output layer cut to its shortlist (`nmt.shortlist`); None: every piece
    vocab: Any = None
    # Decoder rows per sentence: beam search's K hypotheses of a sentence are K consecutive
    # rows of the decoder state, and share that sentence's tensors here (`beams`).
    group: int = 1

    def select(self, index: Tensor) -> Encoded:
        """The sentences at `index` (B',), in that order, repeats allowed (the shortlist is the
        whole batch's and stays); each still serves `group` decoder rows."""
        return Encoded(
            vocab=self.vocab,
            group=self.group,
            src=None if self.src is None else self.src.index_select(0, index),
            states=self.states.index_select(0, index),
            keys=self.keys.index_select(0, index),
            mask=self.mask.index_select(0, index),
            final=self.final.index_select(1, index),
            final_cell=None if self.final_cell is None else self.final_cell.index_select(1, index),
        )

    def beams(self, k: int) -> Encoded:
        """The same sentences, each serving k consecutive decoder rows (beam search's
        hypotheses): attention scores a sentence's k queries against its keys in one product
        (`Attention.forward`'s `group`) instead of against k copies of them, and nothing is
        copied at the start or when sentences leave. Beam 5 on the reference model (2 cores
        of a Xeon with AMX): a 320-row step's attention 2.36 → 2.02 ms, a test set's
        decoding about 10 % faster (session 27, docs/benchmarks.md). `final` stays the
        sentences': the decoder state is made from it before."""
        return replace(self, group=self.group * k)

    def rows(self, x: Tensor) -> Tensor:
        """A per-sentence tensor (B, ...) -> one row per decoder row (B·group, ...)."""
        return x if self.group == 1 else x.repeat_interleave(self.group, dim=0)


@dataclass
class DecoderState:
    """Everything one decoder step carries to the next."""

    hidden: Tensor  # (Ld, B, Hd)
    cell: Tensor | None = None  # (Ld, B, Hd) LSTM only
    feed: Tensor | None = None  # (B, Hd) Luong input feeding: the previous attentional output
    t: int = 0  # the target position the next step predicts (local attention's windows)

    def select(self, index: Tensor) -> DecoderState:
        """The hypotheses at `index` (B',), in that order: beam search reorders with it."""
        return DecoderState(
            hidden=self.hidden.index_select(1, index),
            cell=None if self.cell is None else self.cell.index_select(1, index),
            feed=None if self.feed is None else self.feed.index_select(0, index),
            t=self.t,
        )

    def rnn_state(self) -> RNNState:
        """The `hx` argument of nn.GRU / nn.LSTM."""
        return self.hidden if self.cell is None else (self.hidden, self.cell)


def split_rnn_state(state: RNNState) -> tuple[Tensor, Tensor | None]:
    """nn.GRU returns h, nn.LSTM returns (h, c): give both as (h, c or None)."""
    return state if isinstance(state, tuple) else (state, None)


def rnn_layer(
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


def run_rnn(rnn: nn.GRU | nn.LSTM, x: Any, hx: RNNState | None) -> tuple[Any, RNNState]:
    """`rnn(x, hx)`, on a GPU in float32 (TF32 products) outside autocast, whatever the
    autocast dtype (`rnn_outside_autocast`); elsewhere as called. x: a (B, T, In) tensor or
    a PackedSequence. Returns what nn.GRU / nn.LSTM return, in x's dtype on a GPU.
    """
    if not rnn_outside_autocast(x.data.device.type, torch.is_autocast_enabled("cuda")):
        return rnn(x, hx)
    dtype = x.data.dtype
    with autocast_off("cuda"):
        if isinstance(hx, tuple):
            hx = (hx[0].float(), hx[1].float())
        elif hx is not None:
            hx = hx.float()
        out, state = rnn(x.float(), hx)
    return out.to(dtype), state


def rnn_outside_autocast(device_type: str, autocast_on: bool) -> bool:
    """Whether the RNN modules run in float32 outside autocast: on CUDA under autocast.

    ATen's autocast wrapper for cuDNN RNNs casts to fp16 whatever the autocast dtype, so
    under bf16 autocast (no loss scaling) the RNNs' gradients would be unscaled fp16 and
    underflow; and each step-by-step call (search, input feeding, LSTM) would re-cast and
    re-flatten the weights. In float32 the weights are used as they are, with TF32 tensor
    cores (`runtime.configure_device`), and the products around the RNNs (attention, output
    layer, the loss's) stay in the autocast dtype. On the CPU autocast leaves the RNNs in
    the dtype it is given (bf16 where the CPU has bf16 units), which is measured and fine.
    """
    return device_type == "cuda" and autocast_on


def fused_loop(
    decoder: BahdanauDecoder | LuongDecoder,
    emb: Tensor,
    state: DecoderState,
    enc: Encoded,
    feed_mask: Tensor | None = None,
) -> tuple[Tensor, ...] | None:
    """The teacher-forced loop by `nmt.recurrence` (same numbers, one weight-gradient product
    per weight), or None where it does not apply: LSTM, several layers, several heads, an
    unknown scorer. feed_mask (T, B, Hd): Luong's h̃ dropped (`LuongDecoder.feed_dropout`)."""
    rnn = decoder.rnn  # int8 (`nmt.int8`): a quantized GRU, not nn.GRU
    if not decoder.fused or not isinstance(rnn, nn.GRU) or rnn.num_layers != 1:
        return None
    scorer = scorer_of(decoder.attention)
    if scorer is None:
        return None
    # Luong's W_c; its bias exists exactly when the output is linear (no tanh), as the loop reads it
    combine = decoder.combine if isinstance(decoder, LuongDecoder) else None
    size = emb.size(-1)
    w_ih, w_hh, b_ih, b_hh = rnn.all_weights[0]  # w_ih (3Hd, E + R): the embedding's first
    gi_emb = onednn.linear_layer(emb, w_ih[:, :size], b_ih)  # (B, T, 3Hd)
    return decoder_loop(
        gi_emb=gi_emb,
        h0=state.hidden[0],
        w_ir=w_ih[:, size:],
        w_hh=w_hh,
        b_hh=b_hh,
        w_c=None if combine is None else combine.weight,
        b_c=None if combine is None else combine.bias,
        scorer=scorer,
        keys=enc.keys,
        values=enc.states,
        mask=enc.mask,
        feed_mask=feed_mask,
    )


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
        self.rnn = rnn_layer(
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
        self, emb: Tensor, state: DecoderState, enc: Encoded, heads: bool = False
    ) -> tuple[Tensor, Tensor, DecoderState, Tensor]:
        """One step: emb (B, E) -> new top state s_t (B, Hd), context c_t (B, 2He), state,
        attention (B, [H,] S)."""
        query = state.hidden[-1]  # (B, Hd) s_{t-1}, top layer
        context, weights = self.attention(
            query, enc.keys, enc.states, enc.mask, first=state.t, heads=heads, group=enc.group
        )
        rnn_in = torch.cat([emb, context], dim=-1).unsqueeze(1)  # (B, 1, E + 2He)
        out, new = run_rnn(self.rnn, rnn_in, state.rnn_state())
        h, c = split_rnn_state(new)
        return out.squeeze(1), context, DecoderState(hidden=h, cell=c, t=state.t + 1), weights

    def _pre_output(self, s: Tensor, context: Tensor, emb: Tensor) -> Tensor:
        """(B, [T,] Hd), (B, [T,] 2He), (B, [T,] E) -> (B, [T,] Hd)."""
        return vml.tanh(onednn.layer(self.pre_output, torch.cat([s, context, emb], dim=-1)))

    def step(
        self, emb: Tensor, state: DecoderState, enc: Encoded
    ) -> tuple[Tensor, DecoderState, Tensor]:
        """emb (B, E) embedded y_{t-1} -> pre-output (B, Hd), new state, attention (B, S)."""
        s, context, state, weights = self._step_core(emb, state, enc)
        return self._pre_output(s, context, emb), state, weights

    def forward(
        self, emb: Tensor, state: DecoderState, enc: Encoded, heads: bool = False
    ) -> tuple[Tensor, Tensor]:
        """Teacher forcing: emb (B, T, E) -> pre-outputs (B, T, Hd), attention (B, T, S)
        (heads=True: each head's, (B, H, T, S))."""
        fused = None if heads else fused_loop(self, emb, state, enc)
        if fused is not None:
            s_all, c_all, w_all = fused  # (B, T, Hd), (B, T, 2He), (B, T, S)
            return self._pre_output(s_all, c_all, emb), w_all
        states, contexts, weights = [], [], []
        for t in range(emb.size(1)):
            s, context, state, w = self._step_core(emb[:, t], state, enc, heads)
            states.append(s)
            contexts.append(context)
            weights.append(w)
        s_all = torch.stack(states, dim=1)  # (B, T, Hd)
        c_all = torch.stack(contexts, dim=1)  # (B, T, 2He)
        return self._pre_output(s_all, c_all, emb), torch.stack(weights, dim=-2)


class LuongDecoder(nn.Module):
    """Luong et al. 2015: the RNN steps first, attends with s_t, emits h̃_t = tanh(W_c [c_t; s_t]).

    With input feeding, h̃_{t-1} joins the next RNN input, so the decoder runs step by step.
    Without it the RNN reads the whole target in one call and attention for all steps is one
    batched product (the training fast path); `step` gives the same numbers one step at a time.
    """

    # input feeding by nmt.recurrence, without it the GRU by nmt.encoder_loop's `decoder_gru`,
    # where they apply; False: step by step and nn.GRU
    fused = True

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
        linear_output: bool = False,
        feed_dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.attention = attention
        self.output_size = hidden_size
        self.input_feeding = input_feeding
        # OpenNMT-py's placement (`model.feed_dropout`): h̃ dropped once in teacher forcing,
        # the dropped h̃ fed back and returned (the output layer then drops nothing itself)
        self.feed_dropout = Dropout(feed_dropout)
        self.linear_output = linear_output  # kept: int8's quantized combine has no .bias tensor
        self.rnn = rnn_layer(
            cell,
            input_size=emb_size + (hidden_size if input_feeding else 0),
            hidden_size=hidden_size,
            num_layers=num_layers,
            dropout=dropout,
        )
        # Luong's W_c has no bias; the linear output (OpenNMT-py's mlp attention) has one.
        self.combine = nn.Linear(context_size + hidden_size, hidden_size, bias=linear_output)

    def init_state(self, enc: Encoded) -> DecoderState:
        feed = enc.final.new_zeros(enc.final.shape[1:]) if self.input_feeding else None  # (B, Hd)
        return DecoderState(hidden=enc.final, cell=enc.final_cell, feed=feed)

    def _attend(
        self, s: Tensor, enc: Encoded, first: int, heads: bool = False
    ) -> tuple[Tensor, Tensor]:
        """s (B, [T,] Hd) at target positions first, first + 1, ... -> h̃ (B, [T,] Hd),
        attention (B, [H,] [T,] S)."""
        context, weights = self.attention(
            s, enc.keys, enc.states, enc.mask, first, heads, group=enc.group
        )
        out = onednn.layer(self.combine, torch.cat([context, s], dim=-1))  # (B, [T,] Hd)
        return (out if self.linear_output else vml.tanh(out)), weights

    def _step_core(
        self, emb: Tensor, state: DecoderState, enc: Encoded, heads: bool = False
    ) -> tuple[Tensor, DecoderState, Tensor]:
        """One step: emb (B, E) -> h̃_t (B, Hd), new state, attention (B, [H,] S)."""
        rnn_in = emb if state.feed is None else torch.cat([emb, state.feed], dim=-1)
        out, new = run_rnn(self.rnn, rnn_in.unsqueeze(1), state.rnn_state())  # (B, 1, Hd)
        h, c = split_rnn_state(new)
        h_tilde, weights = self._attend(out.squeeze(1), enc, state.t, heads)
        feed = h_tilde if self.input_feeding else None
        return h_tilde, DecoderState(hidden=h, cell=c, feed=feed, t=state.t + 1), weights

    def step(
        self, emb: Tensor, state: DecoderState, enc: Encoded
    ) -> tuple[Tensor, DecoderState, Tensor]:
        """emb (B, E) embedded y_{t-1} -> pre-output h̃_t (B, Hd), new state, attention (B, S)."""
        return self._step_core(emb, state, enc)

    def forward(
        self, emb: Tensor, state: DecoderState, enc: Encoded, heads: bool = False
    ) -> tuple[Tensor, Tensor]:
        """Teacher forcing: emb (B, T, E) -> pre-outputs h̃ (B, T, Hd), attention (B, T, S)
        (heads=True: each head's, (B, H, T, S))."""
        if not self.input_feeding:
            if self.fused and decoder_applies(self.rnn, emb):  # same numbers, fewer operators
                out = decoder_gru(self.rnn, emb, state.hidden)  # (B, T, Hd) float32
            else:
                out, _ = run_rnn(self.rnn, emb, state.rnn_state())  # (B, T, Hd)
            return self._attend(out, enc, state.t, heads)
        B, T = emb.shape[:2]
        masks = self.feed_dropout.mask((T, B, self.output_size), emb)  # (T, B, Hd) or None
        fused = None if heads else fused_loop(self, emb, state, enc, masks)
        if fused is not None:
            return fused[0], fused[1]  # (B, T, Hd), (B, T, S)
        outputs, weights = [], []
        for t in range(T):
            h_tilde, state, w = self._step_core(emb[:, t], state, enc, heads)
            if masks is not None:  # the dropped h̃_t is what the output layer and step t + 1 read
                h_tilde = h_tilde * masks[t]  # (B, Hd)
                state = replace(state, feed=h_tilde)
            outputs.append(h_tilde)
            weights.append(w)
        # (B, T, Hd), (B, [H,] T, S)
        return torch.stack(outputs, dim=1), torch.stack(weights, dim=-2)


Decoder = BahdanauDecoder | LuongDecoder
