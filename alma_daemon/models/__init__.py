"""The networks learners are made of: the paper's backbones (MLP, reduced VGG19-BN), tree-gated
mixtures of experts, the growable Firefly network, stacked members and the Switch Transformer LM.
"""
