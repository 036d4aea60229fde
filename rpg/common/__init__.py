"""Small pieces that the layers above the math share (the driver, the launcher, the reports, the study),
torch-free and verl-free.
"""
