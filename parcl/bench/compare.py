def add_arguments(p):
    pass
