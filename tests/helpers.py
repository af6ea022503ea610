"""Small helpers shared by the tests."""


def as_list(x):
    """Index arrays of either backend (numpy array, torch tensor, list) as a list of ints."""
    if x is None:
        return None
    if hasattr(x, "tolist"):
        return [int(v) for v in x.tolist()]
    return [int(v) for v in x]
