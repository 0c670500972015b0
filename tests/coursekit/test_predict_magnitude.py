"""coursekit.predict.compare(..., magnitude=True): round-off gaps and quantities that span decades."""
from coursekit.predict import ROUND_OFF, compare


def test_round_off_values_agree_with_zero(capsys):
    assert compare(0, 0.0, magnitude=True) is True
    assert compare("1e-7", 0.0, magnitude=True) is True
    assert compare(0, 3e-8, magnitude=True) is True
    assert "round-off" in capsys.readouterr().out


def test_within_a_factor_of_ten():
    assert compare(2e-3, 9e-3, magnitude=True) is True
    assert compare(1e-4, 9e-3, magnitude=True) is False
    assert compare(0, 1e-3, magnitude=True) is False
    assert compare(10 * ROUND_OFF, 0.0, magnitude=True) is False


def test_relative_tolerance_is_unchanged_without_magnitude():
    assert compare(1.2, 1.0) is True and compare(1.3, 1.0) is False
