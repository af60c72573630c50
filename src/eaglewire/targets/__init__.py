"""The target model and its template: loading, families, capture points (the one reading of engine ids), kernels.

May import: infra.
"""
