"""Calibration data (published measurements) and the model's predictions for them.
"""
