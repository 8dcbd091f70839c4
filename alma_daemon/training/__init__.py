"""Training: the loop with early stopping on validation error, optimizers, compilation, FLOP counting,
members trained as one stacked model, and members spread over distributed ranks.
"""
