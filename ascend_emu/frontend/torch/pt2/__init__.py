"""Exported PyTorch programs (``torch.export``, ``.pt2``): archive (the file read as a hostile input), loader (the
FX graph of aten ops -> the plain graph, through :mod:`..aten`'s lowerings traced by trace), node (an ``Aten<Op>``
node run by torch: the AI CPU and host), reference (torch float32, every FX node dumped)."""
