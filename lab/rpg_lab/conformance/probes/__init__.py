"""Each framework's KL term, called as the framework calls it, behind one small protocol (``protocol``): a module
per framework, importing torch and that framework only, so that it runs in the framework's own environment."""
