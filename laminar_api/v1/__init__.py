"""Generated code: do not edit; run ``make proto``."""
