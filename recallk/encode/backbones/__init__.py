"""The model families behind ``encode.backbone``: efficientnet_lite0, ``timm:``, ``open_clip:``,
``torchvision:`` and ``hf:`` (each imported only when used, through :mod:`recallk.encode.registry`), and
their shared torch plumbing (:mod:`~recallk.encode.backbones.torch_common`)."""
