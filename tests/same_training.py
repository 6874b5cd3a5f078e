"""One check for the training-speed tests: a faster path trains the same run as its reference."""

import torch


def losses_and_weights(result, model) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """A run's training losses (float64) and its final weights, detached."""
    losses = torch.tensor([r["train_loss"] for r in result.history], dtype=torch.float64)
    return losses, [p.detach().clone() for p in model.parameters()]


def assert_trains_the_same(results: dict, reference: str, modes, *, weight_atol: float) -> None:
    """`results[mode]` = losses_and_weights(...). The reference run trained (its last loss at least 1%
    below its first), and every other mode's losses match it to 1e-4 relative and its weights to 1e-4
    relative plus `weight_atol`."""
    ref_losses, ref_weights = results[reference]
    assert ref_losses[-1] < 0.99 * ref_losses[0]  # it trained
    for mode in modes:
        losses, weights = results[mode]
        torch.testing.assert_close(losses, ref_losses, rtol=1e-4, atol=0)
        for w, r in zip(weights, ref_weights):
            torch.testing.assert_close(w, r, rtol=1e-4, atol=weight_atol)
