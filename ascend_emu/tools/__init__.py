"""Jobs built from the public API: fusion bisection, the demo."""
