"""MemberId (pure): the string form results, member tables and checkpoints hold, parsed back exactly."""
import pytest

from schedulers.member_id import MemberId


@pytest.mark.parametrize("text, member", [
    ("m00007", MemberId("m00007")),
    ("m00007#1", MemberId("m00007", seed=1)),
    ("m00007@2", MemberId("m00007", 2)),
    ("m00007@2#3", MemberId("m00007", 2, 3)),
    ("m00012@16#10", MemberId("m00012", 16, 10)),
    ("target", MemberId("target")),
])
def test_the_string_form_round_trips(text, member):
    assert MemberId.parse(text) == member and str(member) == text
    assert MemberId.parse(str(member)) == member


def test_search_members_ladder_members_and_their_seeds():
    search, ladder = MemberId.parse("m00003#1"), MemberId.parse("m00003@4#1")
    assert search.is_search and not ladder.is_search and search.config == ladder.config == "m00003"
    assert (search.scale_or(8), ladder.scale_or(8)) == (8, 4)
    assert str(search.repeat(0)) == "m00003" and str(ladder.repeat(2)) == "m00003@4#2"
    assert str(MemberId("m00003", 4, 0)) == "m00003@4"  # the first seed is written without one


@pytest.mark.parametrize("text", ["", "@2", "m1@", "m1#", "m1#0", "m1@0", "m1@02", "m1#2@4", "m1@2@4", "m1@x",
                                  "m1#-1"])
def test_a_bad_member_id_is_refused_naming_it(text):
    with pytest.raises(ValueError, match=f"MemberId: {text!r} is not a member id; member ids read "
                                         r"<config>\[@<scale>\]\[#<seed>\]"):
        MemberId.parse(text)


@pytest.mark.parametrize("args, problem", [
    (("m1@2",), "config must be a non-empty id without '@' or '#'"),
    (("",), "config must be a non-empty id"),
    (("m1", 0), "scale must be an int >= 1"),
    (("m1", None, -1), "seed must be an int >= 0"),
])
def test_bad_parts_are_refused(args, problem):
    with pytest.raises(ValueError, match=f"MemberId: {problem}"):
        MemberId(*args)
