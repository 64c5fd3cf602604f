"""The contract's AWQ packer (written from the published layout) agrees with AutoAWQ's own
packer (bit for bit, but for AutoAWQ's unclamped overflow), and dequantizes AutoAWQ's tensors
to the weight AutoAWQ's ``dequantize_gemm`` gives."""

import pytest
import torch

from kvserve_quant_awq.contract import AwqContract, unpack_columns


@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_contract_packer_matches_autoawq(autoawq, group_size):
    torch.manual_seed(group_size)
    linear = torch.nn.Linear(256, 96, bias=False)
    tool = autoawq.linear_tensors(linear, group_size)

    contract = AwqContract()
    contract.quant_config = {**AwqContract.quant_config, "group_size": group_size}
    ours = contract.quantize(linear.weight.data.float())
    for name in ("qweight", "qzeros", "scales"):
        assert ours[name].dtype == tool[name].dtype and ours[name].shape == tool[name].shape, name
    for name in ("qzeros", "scales"):
        assert torch.equal(ours[name], tool[name]), f"{name} differs from AutoAWQ's"
    # AutoAWQ does not clamp: a weight whose float16-rounded scale puts it at level 16 carries
    # into the neighbouring nibble. The contract saturates at 15; every other word is identical.
    differ = ours["qweight"] != tool["qweight"]
    saturated = (unpack_columns(ours["qweight"]) == 15).reshape(*differ.shape, 8).any(dim=-1)
    assert bool(saturated[differ].all()) and differ.float().mean() < 5e-3, (
        f"{int(differ.sum())} packed words differ from AutoAWQ's beyond its unclamped level-16 overflow"
    )

    expected = autoawq.dequantize_gemm(tool["qweight"], tool["qzeros"], tool["scales"], 4, group_size).float().t()
    # dequantize_gemm computes in float16; the contract in float64.
    torch.testing.assert_close(contract.dequantize(tool), expected, rtol=1e-3, atol=1e-6)
