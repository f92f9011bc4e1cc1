"""What a rank sends per optimizer step under each sharding (advisor/prediction/sharding.py `collectives`),
pinned to bytes computed by hand, at accumulation 1 and 8: DDP and ZeRO-1 once a step, ZeRO-2's gradients,
ZeRO-3's and FSDP's gathers every micro-batch; and how much of it hides behind compute."""

from dataclasses import replace

import pytest

from advisor.prediction import accelerators
from advisor.prediction.question import Question
from advisor.prediction.sharding import collectives, communication, communication_seconds, overlapped
from advisor.prediction.step import Config
from advisor.rules import load_rules

P = 1_000_000_000  # the model's parameters
ROOT = 100_000_000  # of them, the root's (embeddings, final norm): FSDP2 keeps its gather through backward
N = 8  # ranks


@pytest.fixture(scope="module")
def rules():
    return load_rules()


def payload(trained: int, grad_bytes: int = 4) -> dict:
    """A traced step's counts, as the KB keeps them, at one depth point (the model's own)."""
    return {
        "n_params": [P],
        "trainable": [trained],
        "knobs": [],
        "depth": {},
        "points": [[]],
        "grad_bytes_per_param": grad_bytes,
        "structure": {"root": ROOT},
    }


def question(rules, gpus=N, nodes=1, interconnect=None) -> Question:
    h100 = rules.accelerators["h100-80gb"]
    return Question(
        model=None,
        accelerator=h100,
        budget_gb=80,
        batch_size=1,
        seq_len=2048,
        image_size=None,
        accumulation_steps=None,
        configs=(),
        gpus=gpus,
        nodes=nodes,
        links=accelerators.links(h100, interconnect, rules),
    )


def full(sharding: str, dtype: str = "bf16-mixed") -> Config:
    return Config("full", dtype, "adamw", "standard", sharding=sharding)


RING = (
    N - 1
) / N  # an all-gather or reduce-scatter sends (N-1)/N of the whole tensor; an all-reduce twice that


@pytest.mark.parametrize("k", [1, 8])
@pytest.mark.parametrize(
    "sharding, by_hand",
    [
        # DDP: fp32 gradients (4 bytes) all-reduced once a step, whatever the accumulation (no_sync)
        ("ddp", lambda k: 2 * RING * 4 * P),
        # ZeRO-1: 16-bit gradients reduce-scattered and 16-bit weights all-gathered, once a step
        ("zero1", lambda k: RING * 2 * P + RING * 2 * P),
        # ZeRO-2: the gradients every micro-batch, the weights once
        ("zero2", lambda k: k * RING * 2 * P + RING * 2 * P),
        # ZeRO-3: 16-bit weights gathered for forward and for backward, gradients reduce-scattered: each micro-batch
        ("zero3", lambda k: k * RING * (2 * P + 2 * P + 2 * P)),
        # FSDP2 (bf16 params, fp32 reduce): weights for forward, for backward less the root, fp32 gradients
        ("fsdp", lambda k: k * RING * (2 * P + 2 * (P - ROOT) + 4 * P)),
    ],
)
def test_a_full_fine_tunes_bytes_per_step_are_the_libraries(rules, sharding, by_hand, k):
    c = full(sharding)
    sent = communication(c, payload(P), question(rules), k)  # one node: every byte over its link
    assert sent == {"sent": pytest.approx(by_hand(k)), "intra": pytest.approx(by_hand(k)), "inter": 0.0}


def test_a_lora_base_is_gathered_but_only_the_adapters_gradients_move(rules):
    adapters = 10_000_000
    c = Config("lora", "bf16-mixed", "adamw", "standard", sharding="zero3")
    sent = communication(c, payload(adapters), question(rules), 8)["intra"]
    assert sent == pytest.approx(8 * RING * (2 * 2 * (P + adapters) + 2 * adapters))
    ddp = communication(replace(c, sharding="ddp"), payload(adapters), question(rules), 8)["intra"]
    assert ddp == pytest.approx(2 * RING * 4 * adapters)


FSDP_TENSORS = 2 * P + 2 * (P - ROOT) + 4 * P  # what FSDP2 gathers and reduces per micro-batch, whole


def test_hsdp_shards_within_the_node_and_all_reduces_its_shard_across_nodes(rules):
    hsdp = communication(full("hsdp"), payload(P), question(rules, gpus=8, nodes=4), 2)
    assert hsdp["intra"] == pytest.approx(2 * RING * FSDP_TENSORS)
    # each GPU all-reduces its 1/8 of the fp32 gradients with its peers on the 3 other nodes: the node's
    # eight shards together, the whole gradient, cross its ports (2 (M-1)/M of it: an all-reduce)
    assert hsdp["inter"] == pytest.approx(2 * 2 * (4 - 1) / 4 * 4 * P)


def test_a_ring_over_every_node_moves_the_nodes_share_over_the_link_and_the_rest_over_the_network(rules):
    every = communication(full("fsdp"), payload(P), question(rules, gpus=8, nodes=4), 2)
    assert every["sent"] == pytest.approx(2 * 31 / 32 * FSDP_TENSORS)  # a ring over 32 ranks
    assert every["intra"] == pytest.approx(2 * 7 / 8 * FSDP_TENSORS)
    assert every["inter"] == pytest.approx(2 * 3 / 4 * FSDP_TENSORS)  # what enters a node from the 3 others


def test_one_rank_sends_nothing(rules):
    assert collectives(full("fsdp"), payload(P), question(rules, gpus=1)) == []


def test_the_links_set_the_seconds_and_the_interconnect_replaces_them(rules):
    efficiency = rules.fit["distributed"]["collective_efficiency"]
    volume = {"intra": 45e9, "inter": 5e9}
    nvlink = communication_seconds(volume, question(rules, nodes=2), rules)  # NVLink 4; 8 NDR ports a node
    assert nvlink == pytest.approx(max(45e9 / (450e9 * efficiency), 5e9 / (8 * 50e9 * efficiency)))
    slow = communication_seconds(volume, question(rules, nodes=2, interconnect="pcie4,eth-100"), rules)
    assert slow == pytest.approx(
        max(45e9 / (32e9 * efficiency), 5e9 / (12.5e9 * efficiency))
    )  # one NIC a node


@pytest.mark.parametrize("bad", ["nvlink9", "pcie4,nvlink4", "ib-ndr,eth-100", ","])
def test_an_unknown_or_doubled_link_is_refused_with_the_choices(rules, bad):
    from advisor.errors import InputError

    with pytest.raises(InputError) as e:
        accelerators.links(rules.accelerators["h100-80gb"], bad, rules)
    assert e.value.field == "interconnect"
    assert "e.g." in str(e.value) or "Links: nvlink2" in str(e.value)


def test_the_hidden_share_runs_under_compute_and_never_more_than_all_of_it():
    assert overlapped(10.0, 4.0, 0.75) == pytest.approx(10 + 4 - 3)
    assert overlapped(1.0, 4.0, 0.75) == pytest.approx(4.0)  # at most the whole compute hides it
    assert overlapped(10.0, 4.0, 0.0) == pytest.approx(14.0)


@pytest.mark.slow  # over 6 s in a full run (issue 49: make test-fast under 5 minutes)
def test_the_answer_names_the_links_it_used_and_the_steps_communication(invoke, tmp_path):
    """Through the CLI: two nodes of eight H100s under FSDP; --verbose names the node link and the network
    (and that --interconnect gave them), and how much of the step the collectives take."""
    args = [
        "fit",
        "--model",
        "qwen2.5-0.5b",
        "--gpu",
        "H100",
        "--gpus",
        "8",
        "--nodes",
        "2",
        "--sharding",
        "fsdp",
    ]
    args += [
        "--adapter",
        "full",
        "--optimizer",
        "adamw",
        "--strategy",
        "standard",
        "--db",
        tmp_path / "kb.sqlite",
    ]
    asked = invoke(*args, "--interconnect", "nvlink4,roce-400", "--verbose")
    assert asked.exit_code == 0, asked.output
    text = " ".join(asked.output.split())
    assert "Within a node: NVLink 4," in text and "Between nodes: RoCE, 400 Gb/s" in text
    assert text.count("as --interconnect gives") == 2
    assert "of collectives a step" in text and "hidden behind compute" in text
    default = " ".join(invoke(*args, "--verbose").output.split())
    assert (
        "Between nodes: InfiniBand NDR" in default and "usually carry (--interconnect to change)" in default
    )


@pytest.mark.parametrize("bad", ["nvlink9", "pcie4,nvlink4"])
def test_a_bad_interconnect_exits_2_with_a_sentence(invoke, tmp_path, bad):
    result = invoke("fit", "--model", "qwen2.5-0.5b", "--gpu", "H100", "--gpus", "8", "--interconnect", bad)
    assert result.exit_code == 2 and "--interconnect" in result.output, result.output
    assert "Traceback" not in result.output
