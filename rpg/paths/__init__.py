"""Where things are: the recipe's paths in the project's checkout (``checkout``) and a path the user names, taken
from where the user is (``user``)."""
