"""One recurrent KDA step per request over the SGLang state pool ``ssm_states[slot, HV, V, K]``."""
